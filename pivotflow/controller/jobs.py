"""The job table: every job out at a worker, and the figures the jobs make.

One owner for what used to be written from three places (the controller's dispatch and result
paths, recovery's requeue and the train steps' rate): the jobs in flight (sample, stage,
worker, when sent), the count per stage, round-trip windows per stage, and per pool the
completions and busy worker-seconds the planner's rates come from. A worker is busy from its
first job out to its last one back; its busy time is added to the pool it was busy for.

Others read it (``in`` / ``[job_id]`` / ``items()`` / ``len``, ``inflight``, the rate methods);
only its methods change it. The figures are exactly those of the code it replaced (same values,
same order of floating-point additions), so simulated runs match to the digit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import ItemsView, Iterable, KeysView, ValuesView

from pivotflow.controller.pools import WorkerHandle
from pivotflow.controller.sample import Sample
from pivotflow.protocol import JobDone

RTT_WINDOW = 4096  # round trips kept per stage for the medians in the summary

Entry = tuple[Sample, int, str, float]  # sample, stage index, worker id, sent at


class JobTable:
    """Jobs in flight and the per-stage and per-pool figures they make."""

    __slots__ = ("entries", "next_id", "inflight", "rtt_s", "worker_s", "stage_pool",
                 "pool_done", "pool_busy_s", "busy_since")

    def __init__(self, stage_pool: dict[int, str], pools: Iterable[str]) -> None:
        self.entries: dict[int, Entry] = {}
        self.next_id = 0
        self.stage_pool = stage_pool  # stage index -> the pool that serves it
        self.inflight: dict[int, int] = dict.fromkeys(stage_pool, 0)  # stage -> jobs out
        self.rtt_s: dict[int, deque[float]] = {i: deque(maxlen=RTT_WINDOW) for i in stage_pool}
        self.worker_s: dict[int, deque[float]] = {i: deque(maxlen=RTT_WINDOW)
                                                  for i in stage_pool}
        names = list(pools)
        self.pool_done: dict[str, int] = dict.fromkeys(names, 0)
        self.pool_busy_s: dict[str, float] = dict.fromkeys(names, 0.0)
        self.busy_since: dict[str, tuple[str, float]] = {}  # worker -> (pool, since)

    # ------------------------------------------------------------ reads

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.entries

    def __getitem__(self, job_id: int) -> Entry:
        return self.entries[job_id]

    def __len__(self) -> int:
        return len(self.entries)

    def items(self) -> ItemsView[int, Entry]:
        return self.entries.items()

    def values(self) -> ValuesView[Entry]:
        return self.entries.values()

    def keys(self) -> KeysView[int]:
        return self.entries.keys()

    def busy_now(self, now: float) -> dict[str, float]:
        """Per pool, the busy seconds of the workers busy right now (summed in ``busy_since``
        order, as ``sum`` over a filter of it would)."""
        acc: dict[str, float] = {}
        for pool, since in self.busy_since.values():
            acc[pool] = acc.get(pool, 0) + (now - since)
        return acc

    def busy(self, pool: str, busy_now: dict[str, float]) -> float:
        """The pool's busy worker-seconds so far (``busy_now`` from :meth:`busy_now`)."""
        return self.pool_busy_s[pool] + busy_now.get(pool, 0)

    def rate(self, pool: str, busy_now: dict[str, float]) -> float:
        """Completions per busy worker-second (0 before the pool has served)."""
        busy = self.busy(pool, busy_now)
        return self.pool_done[pool] / busy if busy > 0 else 0.0

    # ------------------------------------------------------------ changes

    def new_id(self) -> int:
        """A fresh job id (one whose job is never sent, e.g. a judge template that failed on
        its sample, is simply not used again)."""
        job_id = self.next_id
        self.next_id += 1
        return job_id

    def sent(self, job_id: int, sample: Sample, stage: int, worker: WorkerHandle,
             now: float) -> None:
        """``job_id`` for ``sample`` at ``stage`` went out to ``worker``."""
        self.entries[job_id] = (sample, stage, worker.worker_id, now)
        if not worker.jobs:
            self.busy_since[worker.worker_id] = (self.stage_pool[stage], now)
        worker.jobs.add(job_id)
        self.inflight[stage] += 1

    def finished(self, worker: WorkerHandle, r: JobDone, now: float) -> tuple[Sample, int] | None:
        """``r`` came back from ``worker``: its (sample, stage), or None for a result that is
        not out at that worker (delivered twice, or after a re-dispatch)."""
        entry = self.entries.get(r.job_id)
        if entry is None or entry[2] != worker.worker_id:
            return None
        del self.entries[r.job_id]
        sample, stage, _, sent_at = entry
        worker.jobs.discard(r.job_id)
        self.inflight[stage] -= 1
        self.rtt_s[stage].append(now - sent_at)
        if r.worker_s:
            self.worker_s[stage].append(r.worker_s)
        if not worker.jobs:
            self._idle(worker.worker_id, now)
        if r.finish_reason != "abort":
            self.pool_done[self.stage_pool[stage]] += 1
        return sample, stage

    def take_all(self, worker: WorkerHandle, now: float) -> list[tuple[int, Sample, int]]:
        """Every job out at ``worker`` (it died): (job id, sample, stage), newest first, so
        front pushes keep the original order; the worker is idle after."""
        out = []
        for job_id in sorted(worker.jobs, reverse=True):
            sample, stage, _, _ = self.entries.pop(job_id)
            self.inflight[stage] -= 1
            out.append((job_id, sample, stage))
        worker.jobs.clear()
        self._idle(worker.worker_id, now)
        return out

    def trained(self, pool: str, busy_s: float, done: int) -> None:
        """An optimizer step on ``pool`` took ``busy_s`` worker-seconds for ``done`` samples."""
        self.pool_busy_s[pool] += busy_s
        self.pool_done[pool] += done

    def _idle(self, worker_id: str, now: float) -> None:
        if worker_id in self.busy_since:
            pool, since = self.busy_since.pop(worker_id)
            self.pool_busy_s[pool] += now - since
