"""Workers as the controller sees them, grouped into pools."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pivotflow import defaults

# "lost": a send found it gone; recovery runs on the next loop turn and makes it "dead".
WorkerState = Literal["starting", "loading", "ready", "lost", "dead"]


@dataclass(slots=True)
class WorkerHandle:
    """A worker process: its pool, role, jobs in flight and liveness."""

    worker_id: str
    pool: str
    state: WorkerState = "starting"
    role: str = ""
    model: str = ""
    capacity: int = defaults.MAX_BATCH  # slots; set from the role's max_batch option
    jobs: set[int] = field(default_factory=set)
    training: bool = False
    last_seen: float = 0.0
    version: int = -1
    roles_taken: int = 0  # counts shifts: a trainer that left and came back is a new member
    # warm roles: (role, model) -> ``roles_taken`` when the worker left it loaded; a role
    # taken back (RoleReady.resumed) is the same member it was then
    parked: dict[tuple[str, str], int] = field(default_factory=dict)
    computing: bool = False  # its last heartbeat said its compute thread was at work

    # What happens to a worker, as the controller's parts learn it: each part says so here
    # rather than writing the fields (the roster's record; membership is Roster's alone).

    def heard(self, now: float) -> None:
        """A frame came from it: it lives."""
        self.last_seen = now

    def set_computing(self, busy: bool) -> None:
        """Its heartbeat said whether its compute thread is at work."""
        self.computing = busy

    def assigned(self, role: str, model: str, capacity: int) -> None:
        """Told to load ``role`` for ``model``; it holds ``capacity`` jobs once ready."""
        self.state, self.role, self.model, self.capacity = "loading", role, model, capacity

    def ready(self, version: int, resumed: bool = False) -> None:
        """Its role is loaded at ``version``; ``resumed``: taken back from the parked ones, so
        it counts as the member it was when it left that role."""
        self.state, self.version = "ready", version
        if resumed:
            self.roles_taken = self.parked.pop((self.role, self.model), self.roles_taken)

    def mark_lost(self) -> None:
        """A send found it gone: no more work for it until recovery declares it dead."""
        self.state = "lost"

    def mark_dead(self) -> None:
        self.state = "dead"

    def set_capacity(self, capacity: int) -> None:
        self.capacity = capacity

    def set_training(self, training: bool) -> None:
        """It is (or is no longer) a member of the step in flight."""
        self.training = training


@dataclass(slots=True)
class Pool:
    """A named set of workers hosting one role for one model."""

    name: str
    role: str  # "generate" | "score" (a reference model) | "train"
    model: str
    workers: list[str] = field(default_factory=list)


class Roster:
    """The pools and the workers in them: the one writer of which worker is in which pool.

    ``pools`` and ``workers`` are read by every part (dispatch scans them on every result);
    membership changes only through the methods here: a shift moves a worker, recovery takes a
    dead one out and adds its replacement."""

    __slots__ = ("pools", "workers")

    def __init__(self, pools: dict[str, Pool], assignments: dict[str, str]) -> None:
        self.pools = pools
        self.workers = {w: WorkerHandle(w, name) for w, name in assignments.items()}
        for w, name in assignments.items():
            self.pools[name].workers.append(w)

    def move(self, worker_id: str, to_pool: str) -> None:
        """``worker_id`` leaves its pool for ``to_pool`` (its role and model become that
        pool's; it is loading until the worker says it is ready)."""
        w, dst = self.workers[worker_id], self.pools[to_pool]
        if w.role:  # kept loaded where the worker keeps its roles (it says so when ready)
            w.parked[(w.role, w.model)] = w.roles_taken
        self.pools[w.pool].workers.remove(worker_id)
        dst.workers.append(worker_id)
        w.pool, w.role, w.model, w.state = dst.name, dst.role, dst.model, "loading"
        w.roles_taken += 1

    def remove(self, worker_id: str) -> None:
        """A dead worker leaves its pool (its handle stays, as "dead": a late frame from it is
        recognised and dropped)."""
        w = self.workers[worker_id]
        w.mark_dead()
        self.pools[w.pool].workers.remove(worker_id)

    def add(self, handle: WorkerHandle) -> None:
        """A new worker process (a replacement) joins the pool its handle names."""
        self.workers[handle.worker_id] = handle
        self.pools[handle.pool].workers.append(handle.worker_id)
