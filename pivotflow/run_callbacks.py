"""What a run records as it goes (split from run.py, which assembles and drives the run): the
controller's callbacks on_step, on_eval_round and on_samples, which write each step's record
(metrics.jsonl, the sinks, the live view) with its samples (samples.jsonl) and each evaluation
round (eval.jsonl), and the pools and queues sampled into flow.jsonl."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pivotflow.config import RunConfig
from pivotflow.controller.core import Controller
from pivotflow.controller.records import stage_fields
from pivotflow.errors import MetricsError
from pivotflow.metrics import STEP_KEYS, RunRecorder, StepRecord
from pivotflow.resume import Segment
from pivotflow.sinks import StepSinks
from pivotflow.sinks.samples import step_lines

if TYPE_CHECKING:
    from pivotflow.flow_samples import FlowSampler
    from pivotflow.live import LiveView

# run.py's logger, as before the split: whoever filters on "pivotflow.run" still sees these
log = logging.getLogger("pivotflow.run")


class RunCallbacks:
    """One run segment's record callbacks and what they keep between calls. ``checkpoint`` is
    asked for every ``checkpoint_every`` steps; a record that cannot be written (a full disk)
    fails the run with a MetricsError."""

    # bound by run.py once they exist: the callbacks are handed to the controller's assembly
    # (and the evaluation) before it, and the controller is made after the sinks are opened
    ctl: Controller
    sinks: StepSinks

    def __init__(self, cfg: RunConfig, recorder: RunRecorder, seg: Segment, live: LiveView,
                 checkpoint: Callable[[], None]) -> None:
        self.cfg, self.recorder, self.seg, self.live = cfg, recorder, seg, live
        self.checkpoint = checkpoint
        self.steps: list[dict[str, Any]] = list(seg.cont.steps)  # the whole run's, across resumes
        self.sampled: list[dict[str, Any]] = []  # this step's samples.jsonl lines, until its record
        self.last: dict[str, Any] | None = None  # the newest step record, for the metrics endpoint
        # made once this segment may write: a resume, at its first step
        self.flow: FlowSampler | None = None

    def resume_without_step(self) -> bool:
        """A resume that has recorded no step yet: it leaves every earlier record as it was."""
        return self.seg.ckpt is not None and len(self.steps) == len(self.seg.cont.steps)

    def on_step(self, record: dict[str, Any]) -> None:
        record["controller_cpu_s"] = time.process_time()  # this process is the controller
        record["controller_loop_cpu_s"] = time.thread_time()  # ... its event loop's thread alone
        self.seg.cont.carry_onto(record)  # one clock and one count of shifts across resumes
        std = {k: record[k] for k in STEP_KEYS if k in record}
        extra = {k: v for k, v in record.items() if k not in STEP_KEYS}
        first = self.resume_without_step()
        try:
            self.recorder.record_step(StepRecord(**std, extra=extra))
            self.recorder.record_samples(record["step"], self.sampled)
            if first:  # a resume's config, once it has a step
                self.recorder.write_config(self.seg.config)
        except OSError as exc:
            self._fail(exc)
            return
        # only what the summary needs: a long run must not keep every record in memory
        self.steps.append({"step": record["step"], "task_accuracy": record.get("task_accuracy")})
        self.sampled.clear()
        self.last = record
        self.sinks.write(record)
        self.live.update_step(record)
        if self.cfg.checkpoint_every and record["step"] % self.cfg.checkpoint_every == 0:
            self.ctl.collector.collect(self.checkpoint)

    def on_eval_round(self, record: dict[str, Any]) -> None:
        try:
            self.recorder.record_eval(record)
        except OSError as exc:
            self._fail(exc)
            return
        log.info("evaluation at step %d: task_accuracy %s, reward_mean %s (%d prompts)",
                 record["step"], record["task_accuracy"], record["reward_mean"],
                 record["prompts"])
        self.live.update_eval(record)

    def on_samples(self, batch: list[Any], step: int, version: int) -> None:
        self.sampled[:] = step_lines(batch, step, version, self.cfg.log_samples,
                                     stage_fields(self.ctl))

    def sample_flow(self) -> None:
        if self.resume_without_step():
            return  # a resume that records no step leaves every earlier record as it was
        if self.flow is None:
            from pivotflow.flow_samples import FlowSampler

            self.flow = FlowSampler(self.ctl, self.seg.out / "flow.jsonl")
        self.flow.sample()

    def _fail(self, exc: OSError) -> None:
        self.ctl.fail(MetricsError(f"cannot write the run records in {self.seg.out}: "
                                   f"{exc.strerror or exc}"))
