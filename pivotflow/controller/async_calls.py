"""The graph's ``async def`` map, group and filter functions, awaited on the controller's loop.

A plain stage function runs inline and holds the loop while it runs, which is right for a few
microseconds of Python and wrong for a call to a reward server or an LLM judge behind an API
(milliseconds to seconds each, one sample at a time: every worker would wait on it). A stage
function whose call returns an awaitable (``async def``, or anything returning a coroutine) is
awaited here instead, as a task of the controller's task group, at most the stage's
``concurrency`` at once (the rest wait their turn in order); the run goes on meanwhile, and when
a call is back its value is written and the samples move on, as if the function had returned
it inline (``Controller.stage_call_done``).

Where the samples are meanwhile (``waiting``) is one of the places a snapshot saves them, at
the stage they wait at: a resumed run calls again (:meth:`restore`, :meth:`resume`). A call
the run's end cancels leaves its samples there. A call that fails is the stage's StageError,
stopping the run or dropping the group per ``on_error``; a call that comes back for a group
settled meanwhile (another sample's failure skipped it) is dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import statistics
from collections import deque
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from pivotflow.controller import stages, user_code
from pivotflow.controller.sample import Sample, held_out
from pivotflow.errors import StageError
from pivotflow.stage_options import DEFAULT_CONCURRENCY

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller

log = logging.getLogger("pivotflow.controller")


class AsyncCalls:
    """Calls of ``async def`` stage functions: in flight, waiting their turn, or restored."""

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        self.waiting: dict[int, tuple[list[Sample], int]] = {}  # call id -> (samples, stage)
        self._pending: dict[int, Awaitable[Any]] = {}  # call id -> its awaitable, not started
        self._queued: dict[int, deque[int]] = {}  # stage -> call ids over its concurrency
        self._running: dict[int, int] = {}  # stage -> calls in flight
        self._restored: list[tuple[Sample, int]] = []  # a snapshot's samples at a map stage
        self._started: dict[int, float] = {}  # call id -> when it started (the clock's)
        self._seconds: dict[int, list[float]] = {}  # stage -> its calls' times since a record
        self._ids = itertools.count()
        self._group: asyncio.TaskGroup | None = None

    def run_in(self, group: asyncio.TaskGroup | None) -> None:
        """Calls run as tasks of the controller's task group (``Controller.run``); None: the
        run is over, and a call made now keeps its samples waiting (a snapshot saves them)."""
        self._group = group
        if group is None:  # calls never started (their turn, or their task, never came)
            for pending in self._pending.values():
                user_code.discard(pending)
            self._pending.clear()
            self._queued.clear()
            self._running.clear()

    def start(self, idx: int, samples: list[Sample], pending: Awaitable[Any]) -> None:
        """Await ``pending``, the call of stage ``idx``'s function on ``samples`` (one sample
        at a map stage, a group at a group or filter stage), when the stage has room."""
        cid = next(self._ids)
        self.waiting[cid] = (samples, idx)
        if self._group is None:
            user_code.discard(pending)  # the run is over: the samples stay in ``waiting``
            return
        self._pending[cid] = pending
        limit = self.ctl.order[idx].options.get("concurrency", DEFAULT_CONCURRENCY)
        if self._running.get(idx, 0) < limit:
            self._launch(cid, idx)
        else:
            self._queued.setdefault(idx, deque()).append(cid)

    def _launch(self, cid: int, idx: int) -> None:
        assert self._group is not None
        self._running[idx] = self._running.get(idx, 0) + 1
        self._started[cid] = self.ctl.clock.now()
        self._group.create_task(self._await(cid, idx), name=f"stage {self.ctl.order[idx].name}")

    async def _await(self, cid: int, idx: int) -> None:
        ctl = self.ctl
        node = ctl.order[idx]
        samples = self.waiting[cid][0]
        try:
            out = await user_code.awaited(node, "function", self._pending.pop(cid), samples)
        except StageError as exc:
            self._finish(cid, idx)
            if not self._settled(samples):
                if exc.on_error != "skip":
                    ctl.fail(exc)
                    return
                user_code.skip_group(ctl, exc)
                ctl.pump()
            return
        self._finish(cid, idx)
        if self._settled(samples):
            return  # its group was dropped while the call ran
        try:
            ctl.stage_call_done(idx, samples, out)
            ctl.pump()
        except Exception as exc:  # a bug of ours: loudly, not as the stage's error
            log.exception("after stage %s's call on group %d", node.name, samples[0].group_id)
            ctl.fail(exc)

    def _finish(self, cid: int, idx: int) -> None:
        del self.waiting[cid]
        self._seconds.setdefault(idx, []).append(self.ctl.clock.now() - self._started.pop(cid))
        self._running[idx] -= 1
        queued = self._queued.get(idx)
        if queued and self._group is not None:
            self._launch(queued.popleft(), idx)

    def _settled(self, samples: list[Sample]) -> bool:
        gid = samples[0].group_id
        return not held_out(gid) and self.ctl.ledger.settled(gid)

    def in_flight(self) -> int:
        """Calls started or waiting their turn."""
        return len(self.waiting)

    def figures(self) -> dict[str, Any]:
        """For a step record, by the name of each stage that has awaited a call:
        ``stage_calls_waiting`` (calls out or waiting their turn now: a server falling behind
        shows here first) and ``stage_call_ms_p50`` (the median call since the previous
        record, from its start to its result; null if none ended). Empty for a graph that
        never awaited one."""
        if not self._seconds and not self.waiting:
            return {}
        order = self.ctl.order
        stages_seen = sorted(set(self._seconds) | {idx for _, idx in self.waiting.values()})
        p50 = {order[i].name: (statistics.median(self._seconds[i]) * 1e3
                               if self._seconds.get(i) else None) for i in stages_seen}
        waiting = {**dict.fromkeys(p50, 0), **self.figures_now()}
        self._seconds = {i: [] for i in self._seconds}  # (the stage stays in the figures)
        return {"stage_calls_waiting": waiting, "stage_call_ms_p50": p50}

    def figures_now(self) -> dict[str, int]:
        """Stage name -> its calls out or waiting their turn now (stages with one only)."""
        now: dict[str, int] = {}
        for _, idx in self.waiting.values():
            name = self.ctl.order[idx].name
            now[name] = now.get(name, 0) + 1
        return now

    def restore(self, idx: int, sample: Sample) -> None:
        """A snapshot's sample that waited on map stage ``idx``'s call: :meth:`resume` calls
        again for it when the run starts. (One that waited on a group or filter stage's call
        is back at that stage's barrier, its group complete: :meth:`resume` finds it there.)"""
        self._restored.append((sample, idx))

    def resume(self) -> None:
        """Call again for the samples a restored snapshot had waiting on a call."""
        ctl = self.ctl
        now = ctl.clock.now()
        restored, self._restored = self._restored, []
        for sample, idx in restored:
            ctl.advance(sample, idx, now)
        functions = [i for i, node in enumerate(ctl.order) if node.kind in ("group", "filter")]
        for idx, group in ctl.barriers.complete(functions):
            ctl.stage_call_done(idx, group, stages.CALL)

