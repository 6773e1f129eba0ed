"""The controller's side of multi-turn stages: their turn logic, their tool pools, and the
samples waiting on a call (``waiting``: a snapshot saves them, a resume calls again).

Calls run on the tool pool's threads and sandboxed processes, so the event loop never blocks;
when they are back the observation is appended and the sample queues for its next turn.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from pivotflow.controller.sample import Sample
from pivotflow.controller.turns import ToolTurns
from pivotflow.protocol import GenerateJob, JobDone
from pivotflow.tools.pool import ToolPool, ToolResult

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller

log = logging.getLogger("pivotflow.controller")


class ToolCalls:
    """Tool calls of every generate stage declared with ``tools=`` (by stage index)."""

    def __init__(self, ctl: Controller, pools: dict[str, ToolPool] | None) -> None:
        self.ctl = ctl
        self.turns = {i: ToolTurns(n, ctl.tok[n.model or ""]) for i, n in enumerate(ctl.order)
                      if n.kind == "generate" and "tools" in n.options}
        self.pools = {i: (pools or {})[ctl.order[i].name] for i in self.turns}
        self.waiting: dict[int, tuple[Sample, int]] = {}  # sample id -> (sample, stage)
        self._group: asyncio.TaskGroup | None = None

    def run_in(self, group: asyncio.TaskGroup | None) -> None:
        """Calls run as tasks of the controller's task group (``Controller.run``): the run's
        end cancels and awaits them, and one that raises stops the run. None: the run is
        over, and a turn that ends now keeps its sample waiting (a snapshot saves it)."""
        self._group = group

    def job(self, idx: int, job: GenerateJob, sample: Sample) -> GenerateJob:
        """The stage's job as the sample's next turn (unchanged for a single-turn stage)."""
        turns = self.turns.get(idx)
        return job if turns is None else turns.job(job, sample)

    def on_turn(self, idx: int, sample: Sample, r: JobDone) -> bool:
        """Append a finished turn; True when its calls now run (the sample waits here), False
        when the trajectory is complete."""
        calls = self.turns[idx].on_turn(sample, r)
        if calls is None:
            return False
        self.waiting[sample.sample_id] = (sample, idx)
        self._call(idx, sample, calls)
        return True

    def restore(self, sample: Sample, idx: int) -> None:
        """A snapshot's sample that was waiting on a call at stage ``idx``: :meth:`resume`
        calls again for it when the run starts."""
        self.waiting[sample.sample_id] = (sample, idx)

    def resume(self) -> None:
        """Call again for the samples a restored snapshot had waiting on a call."""
        for sample, idx in list(self.waiting.values()):
            self._call(idx, sample, self.turns[idx].pending_calls(sample))

    def _call(self, idx: int, sample: Sample, calls: Any) -> None:
        if self._group is None:
            return  # the run is over (or not started): the sample stays in ``waiting``
        fut = self._group.create_task(self.pools[idx].acall_all(calls), name="tool calls")
        fut.add_done_callback(lambda f: self._done(idx, sample, f))

    def _done(self, idx: int, sample: Sample, fut: asyncio.Future[list[ToolResult]]) -> None:
        if fut.cancelled() or self.waiting.pop(sample.sample_id, None) is None:
            return
        ctl = self.ctl
        try:
            if self.turns[idx].on_observation(sample, fut.result()):
                ctl.edges[idx].push(sample, ctl.clock.now(), front=True)  # finish groups first
            else:  # no room left for another turn: the trajectory ends at its call
                ctl.rollout_done(sample, idx)
                ctl.advance(sample, idx + 1, ctl.clock.now())
            ctl.pump()
        except Exception as exc:  # a closed pool mid-run, a broken observation: loudly
            log.exception("tool call of sample %d failed", sample.sample_id)
            ctl.fail(exc)
