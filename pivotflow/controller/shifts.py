"""Shifts: moving a worker from one pool to another while the run goes on.

Order of a shift (each part timed): stop admitting to the worker → abort its in-flight jobs;
their partial state comes back as "abort" results and is re-queued at the front of its edge, so
a worker that stays resumes each sequence from its prefix without resampling a token →
the worker releases its old role (a trainer's optimizer state is in the parameter store
already: rank 0 publishes it with every version) and loads the new one from the store, of which its warm-up (building the engine and KV cache,
or the optimizer) → it joins the new pool (RoleReady). Trainers move only
between optimizer steps; the next step re-forms the trainers' group. Messages on one DEALER are
ordered, so the abort is always answered before the role changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pivotflow.errors import ConfigError
from pivotflow.protocol import AbortJobs, RoleReady

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller


@dataclass(slots=True)
class ShiftRecord:
    """One shift, timed part by part (seconds since the run started, and durations)."""

    worker_id: str
    from_pool: str
    to_pool: str
    started_s: float
    jobs_aborted: int
    reason: str = ""
    drained_s: float | None = None  # abort sent -> last partial state back
    release_s: float | None = None  # old role's engine/cache freed (worker-side)
    load_s: float | None = None  # new role loaded from the parameter store (worker-side)
    warmup_s: float | None = None  # of load_s, the engine's (optimizer's) own start
    resumed: bool = False  # taken back loaded (warm roles): nothing was loaded
    total_s: float | None = None  # shift ordered -> worker ready in its new pool
    pending_jobs: set[int] = field(default_factory=set)

    def as_record(self) -> dict[str, Any]:
        return {"worker": self.worker_id, "from": self.from_pool, "to": self.to_pool,
                "time_s": self.started_s, "jobs_aborted": self.jobs_aborted,
                "drain_s": self.drained_s, "release_s": self.release_s, "load_s": self.load_s,
                "warmup_s": self.warmup_s, "resumed": self.resumed, "total_s": self.total_s,
                "reason": self.reason}


class ShiftManager:
    """Carries out shifts for the controller and keeps their records."""

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        self.done: list[ShiftRecord] = []
        self.active: dict[str, ShiftRecord] = {}
        self.migrations = 0
        # the role loads that were no shift (start-up, a replacement): a floor for a shift's
        # cost before any shift is measured
        self.first_loads: list[float] = []
        self._last_started: dict[str, float] = {}  # worker -> start of its last finished shift
        self._reported = 0  # shifts in ``done`` that a step record has carried

    def shift(self, worker_id: str, to_pool: str, reason: str = "") -> ShiftRecord:
        """Move ``worker_id`` to ``to_pool``; raises ConfigError for a move it cannot make."""
        ctl = self.ctl
        w = ctl.workers.get(worker_id)
        if w is None or to_pool not in ctl.pools:
            raise ConfigError(f"shift {worker_id} -> {to_pool}: unknown worker or pool")
        src, dst = ctl.pools[w.pool], ctl.pools[to_pool]
        if w.state != "ready" or worker_id in self.active:
            raise ConfigError(f"shift {worker_id}: worker is {w.state}, not ready")
        if w.training:
            raise ConfigError(f"shift {worker_id} {src.name} -> {dst.name}: it is in an "
                              "optimizer step; trainers move only between steps")
        now = ctl.clock.now()
        rec = ShiftRecord(worker_id, src.name, dst.name, now - ctl.started_at, len(w.jobs),
                          reason, pending_jobs=set(w.jobs))
        ctl.roster.move(worker_id, dst.name)
        if w.jobs:
            ctl.send(worker_id, AbortJobs(job_ids=sorted(w.jobs)))
        else:
            rec.drained_s = 0.0
        ctl.assign_role(w)
        self.active[worker_id] = rec
        return rec

    def on_aborted(self, worker_id: str, job_id: int) -> None:
        """A partial state came back: one migration; the drain ends with the last one."""
        self.migrations += 1
        rec = self.active.get(worker_id)
        if rec is not None and job_id in rec.pending_jobs:
            rec.pending_jobs.discard(job_id)
            if not rec.pending_jobs:
                rec.drained_s = self.ctl.clock.now() - self.ctl.started_at - rec.started_s

    def on_job_finished(self, worker_id: str, job_id: int) -> None:
        """A job of a shifting worker finished before the abort reached it."""
        rec = self.active.get(worker_id)
        if rec is not None:
            rec.pending_jobs.discard(job_id)
            if not rec.pending_jobs and rec.drained_s is None:
                rec.drained_s = self.ctl.clock.now() - self.ctl.started_at - rec.started_s

    def on_ready(self, worker_id: str, msg: RoleReady) -> None:
        rec = self.active.pop(worker_id, None)
        if rec is None:
            self.first_loads.append(msg.load_s)
            return
        rec.release_s, rec.load_s, rec.warmup_s = msg.release_s, msg.load_s, msg.warmup_s
        rec.resumed = msg.resumed
        rec.total_s = self.ctl.clock.now() - self.ctl.started_at - rec.started_s
        self.done.append(rec)
        self._last_started[worker_id] = rec.started_s + self.ctl.started_at

    def on_worker_lost(self, worker_id: str) -> None:
        """A shifting worker died: its shift never completes (its jobs are re-queued)."""
        self.active.pop(worker_id, None)

    @property
    def count(self) -> int:
        return len(self.done) + len(self.active)

    def last_started(self) -> dict[str, float]:
        """``{worker: when its last finished shift started}`` (controller clock), a copy: what
        the planner's view holds."""
        return dict(self._last_started)

    def unreported(self) -> list[ShiftRecord]:
        """Shifts finished since the last :meth:`mark_reported` (a step record's events)."""
        return self.done[self._reported:]

    def mark_reported(self) -> None:
        self._reported = len(self.done)
