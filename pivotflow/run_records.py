"""What a run leaves when it stops: the summary's figures and the policy saved as a Hugging
Face folder (split from run.py, which assembles and drives the run)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from pivotflow.controller.core import Controller
from pivotflow.errors import PivotflowError
from pivotflow.graph import Graph
from pivotflow.metrics import Ledger, RunRecorder, RunSummary, read_metrics
from pivotflow.params.base import ParamStore


def decisions_by_shift(ctl: Controller) -> list[dict[str, Any] | None]:
    by_time = {(d["worker"], d["time_s"]): d for d in ctl.decisions}
    return [by_time.get((r.worker_id, r.started_s)) for r in ctl.shifts.done]


def summarize(ctl: Controller, steps: list[dict[str, Any]], wall: float,
               error: BaseException | None) -> RunSummary:
    led = ctl.ledger
    lost = len(ctl.lost_groups())
    samples = led.samples_trained
    admission = getattr(ctl.transport, "admission", None)  # the zmq transport's
    return RunSummary(
        steps=len(steps), wall_s=wall,
        samples_per_s=samples / wall if wall > 0 else 0.0,
        tokens_per_s=ctl.tokens_generated / wall if wall > 0 else 0.0,
        shifts=ctl.shifts.count, migrations=ctl.shifts.migrations,
        worker_restarts=ctl.recovery.restarts,
        ledger=Ledger(prompts_in=led.prompts_in, groups_trained=led.groups_trained,
                      samples_trained=samples, lost=lost, duplicates=led.duplicates),
        extra={"groups_filtered": led.groups_filtered, "groups_skipped": led.groups_skipped,
               "groups_in_flight_at_end":
               ctl.train_buffer.in_flight(), "late_results": led.late_results,
               "jobs_redispatched": ctl.recovery.redispatched,
               "train_steps_redone": ctl.recovery.steps_redone,
               "judge_failures": led.judge_failures, "bad_frames": ctl.transport.bad_frames,
               # Hellos and frames refused for claiming a worker id (transport/admission.py)
               "admission": admission.counters() if admission is not None else None,
               "generation_errors": ctl.errors["generation"],
               "job_rtt_us_p50": ctl.job_rtt_us_p50(),
               "job_worker_us_p50": ctl.job_rtt_us_p50(worker=True),
               "planner": ctl.planner.name,
               "shift_total_s_mean": _mean([r.total_s for r in ctl.shifts.done]),
               "error": None if error is None else f"{type(error).__name__}: {error}",
               **_accuracy_ends(steps)},
    )


def eval_ends(recorder: RunRecorder) -> dict[str, Any]:
    """The summary's evaluation keys, from the whole run's eval.jsonl (a resume's too): the
    rounds taken and the first and last round's step and rule-checked accuracy (none of them
    where the run did not evaluate)."""
    rounds = read_metrics(recorder.evals.path) if recorder.evals.path.exists() else []
    if not rounds:
        return {}
    return {"eval_rounds": len(rounds),
            "eval_task_accuracy_first": rounds[0].get("task_accuracy"),
            "eval_task_accuracy_last": rounds[-1].get("task_accuracy"),
            "eval_task_pass_at_n_first": rounds[0].get("task_pass_at_n"),
            "eval_task_pass_at_n_last": rounds[-1].get("task_pass_at_n"),
            "eval_step_first": rounds[0]["step"], "eval_step_last": rounds[-1]["step"]}


def save_policy_folder(store: ParamStore, graph: Graph, out: Path,
                     model_dir: Path | None) -> None:
    """The newest policy as a Hugging Face folder: config.json (the config as the store holds
    it), model.safetensors, and the model folder's tokenizer files, so transformers'
    AutoModelForCausalLM and AutoTokenizer both load it. Written beside it and swapped in
    whole: a write that fails (a full disk) leaves the earlier folder as it was."""
    from pivotflow.engines.torch.weights import save_checkpoint
    from pivotflow.params.hf_folder import copy_side_files

    model = graph.order()[-1].model or ""
    try:
        version, config, tensors = store.load(model)
    except PivotflowError:
        return
    dst = out / "checkpoints" / model
    tmp, old = dst.with_name(f".tmp-{model}-{os.getpid()}"), dst.with_name(
        f".old-{model}-{os.getpid()}")
    from safetensors import SafetensorError

    try:
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            save_checkpoint(tmp, config, tensors)
        except SafetensorError as exc:  # how safetensors reports a failed write
            raise OSError(str(exc)) from exc
        if model_dir is not None:  # the tokenizer and generation files, as the store's do
            copy_side_files(model_dir, tmp)
        (tmp / "version").write_text(str(version))
        if dst.exists():
            os.rename(dst, old)
        os.rename(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _accuracy_ends(steps: list[dict[str, Any]]) -> dict[str, float | None]:
    """Rule-checked accuracy at the start and at the end of the run: means over the first and
    last tenth of the steps (at least 5), since one step's 64 samples are noisy."""
    acc = [r["task_accuracy"] for r in steps if r.get("task_accuracy") is not None]
    k = max(5, len(acc) // 10)
    start = sum(acc[:k]) / len(acc[:k]) if acc else None
    end = sum(acc[-k:]) / len(acc[-k:]) if acc else None
    return {"task_accuracy_start": start, "task_accuracy_end": end,
            "task_accuracy_gain": None if start is None or end is None else end - start}
