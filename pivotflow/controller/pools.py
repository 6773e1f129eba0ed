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
    computing: bool = False  # its last heartbeat said its compute thread was at work


@dataclass(slots=True)
class Pool:
    """A named set of workers hosting one role for one model."""

    name: str
    role: str  # "generate" | "score" (a reference model) | "train"
    model: str
    workers: list[str] = field(default_factory=list)
