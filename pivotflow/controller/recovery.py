"""A worker that dies (its process exits, or it stops heartbeating) loses nothing.

Its in-flight jobs go back to the front of their edges: the sampling noise is a function of
(seed, position), so on the embedded engine a sequence generated again elsewhere comes out token
for token the same (vLLM and SGLang continue a sampled one with other tokens: see their adapters).
A train step it took part in is undone (the batch goes back to the trainer's buffer; rank 0
publishes weights and optimizer state every step, so the redo starts from the store) and the
step's other ranks, blocked in a collective with the dead one, are restarted too. The pool is
refilled by a new process with a new id: ids are never reused, so anything a dead id sends
later — a paused worker that wakes up, a result delivered twice — is dropped and counted.

A worker that dies before it ever served is not respawned: that is a broken setup (a bad model
path, an import error), and the run stops with its stderr instead of looping.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from pivotflow.controller.pools import WorkerHandle
from pivotflow.controller.train_batch import VOID
from pivotflow.errors import WorkerError

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller

log = logging.getLogger("pivotflow.controller")

# (new worker id, the dead one it replaces): start the process; kill the old one if it lives.
Respawn = Callable[[str, str], None]


class Recovery:
    """Turns a worker's death into re-dispatch and a replacement process."""

    def __init__(self, ctl: Controller, respawn: Respawn | None = None,
                 max_restarts: int = 100) -> None:
        self.ctl = ctl
        self.respawn = respawn
        self.max_restarts = max_restarts
        self.restarts = 0
        self.redispatched = 0
        self.steps_redone = 0
        self.served: set[str] = set()  # workers that reached "ready" at least once

    def mark_served(self, worker_id: str) -> None:
        """The worker reached "ready": from now on its death is recovered, not fatal."""
        self.served.add(worker_id)

    def replaces(self, worker_id: str) -> bool:
        """Whether a failure of this worker is recovered (it served, and workers can be
        started again) rather than a broken setup that stops the run."""
        return worker_id in self.served and self.respawn is not None

    def worker_lost(self, worker_id: str, reason: str) -> None:
        ctl = self.ctl
        w = ctl.workers.get(worker_id)
        if w is None or w.state == "dead":
            return
        served = worker_id in self.served
        if self.respawn is None or not served:
            w.mark_dead()
            ctl.fail(WorkerError(f"worker {worker_id} (pool {w.pool}) died: {reason}"))
            return
        log.warning("worker %s (pool %s) died: %s", worker_id, w.pool, reason.splitlines()[0])
        ctl.roster.remove(worker_id)
        self._requeue_jobs(w)
        ctl.shifts.on_worker_lost(worker_id)
        blocked = ctl.training.on_worker_lost(worker_id)
        if blocked is not None:
            self.steps_redone += 1
        self._replace(w)
        for other in blocked or []:  # stuck in a collective with the dead rank: restart them too
            ow = ctl.workers[other]
            if ow.state != "dead":
                ctl.roster.remove(other)
                self._requeue_jobs(ow)
                self._replace(ow)

    def _requeue_jobs(self, w: WorkerHandle) -> None:
        ctl = self.ctl
        now = ctl.clock.now()
        taken = ctl.jobs.take_all(w, now)  # newest first: front pushes keep the order
        for _, sample, idx in taken:
            if VOID not in sample.private:  # (a refused group's: generated again already)
                ctl.edges[idx].push(sample, now, front=True)
                self.redispatched += 1
        # only now, every sample back in a queue, may a pending checkpoint stop waiting
        for job_id, _, _ in taken:
            ctl.collector.job_back(job_id)

    def _replace(self, dead: WorkerHandle) -> None:
        ctl = self.ctl
        self.restarts += 1
        if self.restarts > self.max_restarts:
            ctl.fail(WorkerError(f"{self.restarts} worker restarts (max_worker_restarts "
                                 f"{self.max_restarts}); the last: {dead.worker_id}"))
            return
        base = dead.worker_id.split("~")[0]
        new_id = f"{base}~r{self.restarts}"
        ctl.roster.add(WorkerHandle(new_id, dead.pool, last_seen=ctl.clock.now()))
        assert self.respawn is not None  # checked by worker_lost
        self.respawn(new_id, dead.worker_id)
