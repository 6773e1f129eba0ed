"""A checkpoint's wait for the generations in flight: the one owner of which jobs it waits for.

A snapshot must hold every sample somewhere it can see (a queue, a barrier, a train batch), so
before one is written each generation still out at a worker is aborted and comes back as its
partial state, as for a migration (its tokens so far are kept and it resumes from that prefix
right after). Dispatch pauses while jobs are awaited (``waiting`` not empty: the controller's
``_dispatch`` reads it), so nothing new goes out that the snapshot would then miss.
"""

from __future__ import annotations

from collections.abc import Callable

from pivotflow.controller.jobs import JobTable
from pivotflow.protocol import AbortJobs, ToWorker


class CheckpointCollector:
    """Collects the jobs in flight before a snapshot is written, then writes it."""

    def __init__(self, jobs: JobTable, send: Callable[[str, ToWorker], bool]) -> None:
        self.jobs, self.send = jobs, send
        # the job ids a pending checkpoint waits for (read by the handlers; they leave it
        # through job_back)
        self.waiting: set[int] = set()
        self._write: Callable[[], None] | None = None

    def collect(self, write: Callable[[], None]) -> None:
        """Call ``write`` once every job in flight has come back as its partial state (at once
        when none is out); a second checkpoint asked for meanwhile writes right after it."""
        if self._write is not None:  # one is collecting already: write after it
            first, then = self._write, write
            self._write = lambda: (first(), then())[-1]
            return
        by_worker: dict[str, list[int]] = {}
        for job_id, (_, _, wid, _) in self.jobs.items():
            by_worker.setdefault(wid, []).append(job_id)
        if not by_worker:
            write()
            return
        self.waiting = {j for ids in by_worker.values() for j in ids}
        self._write = write
        for wid, ids in by_worker.items():
            self.send(wid, AbortJobs(job_ids=sorted(ids)))

    def job_back(self, job_id: int) -> None:
        """A job the pending checkpoint waits for came back, or was re-queued by recovery, or
        finished and its sample moved on (any other id: nothing)."""
        if job_id in self.waiting:
            self.waiting.discard(job_id)
            if not self.waiting and self._write is not None:
                write, self._write = self._write, None
                write()
