"""Planners decide pool sizes; the controller carries their moves out as shifts.

A planner sees a ``PlannerView`` (numbers the controller measured) and returns moves. It never
touches sockets or workers, so the same planner code runs in the real controller and in the
simulator, and the same view gives the same decision in both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(slots=True, frozen=True)
class PoolView:
    """What the planner knows of one pool; ``PlannerView.pools`` lists them in pipeline order
    (generate and judge pools first, the trainer pool last)."""

    name: str
    ready: list[str]  # worker ids that can be moved now
    workers: int  # all workers in the pool, loading ones included
    remaining: int  # samples that still have to pass this pool in the work admitted so far
    per_worker_rate: float  # samples/s one busy worker of this pool completes (measured)
    role: str = "generate"  # "generate" (rollout, judge) or "train"
    queued: int = 0  # samples at this pool's stage now: queued or in flight (a ready batch)
    measured: bool = True  # False: the pool has not served yet and its rate is borrowed
    # The whole pool's measured samples/s at each size it has served at, as (size, rate) by
    # size (the trainer pool: a data-parallel step does not run w times faster on w workers;
    # measured in tokens/s and given at the tokens per sample of the work waiting, so that a
    # size measured on shorter samples is not read as faster; empty: per_worker_rate * n)
    rate_by_size: tuple[tuple[int, float], ...] = ()
    # Generate pools: jobs in flight at the pool now, and the job slots of one worker (its
    # engine's batch); 0 where unknown.
    inflight: int = 0
    slots: int = 0
    # The trainer pool: samples one optimizer step takes, and whether the step is running now
    # (``queued`` is then its batch; workers that join now serve only the next step).
    batch: int = 0
    step_running: bool = False
    busy_share: float = 0.0  # the trainer pool: share of the time a step has been running
    # Totals since the run began: samples completed here and busy worker-seconds they took
    # (``per_worker_rate`` is their ratio; a planner takes differences for a recent rate)
    done: int = 0
    busy_s: float = 0.0


@dataclass(slots=True, frozen=True)
class PlannerView:
    now_s: float
    pools: dict[str, PoolView]
    shift_cost_s: float  # mean measured shift time (a prior before the first shift)
    last_shift_s: dict[str, float] = field(default_factory=dict)  # worker -> when it last moved
    version: int = 0  # optimizer steps done (the policy version)


@dataclass(slots=True, frozen=True)
class Move:
    """Shift ``worker`` to ``to_pool``; ``reason`` and ``numbers`` are logged with it."""

    worker: str
    from_pool: str
    to_pool: str
    reason: str
    numbers: dict[str, float | None]


class Planner(Protocol):
    """Called every ``interval_s`` with the current view."""

    name: str
    interval_s: float

    def decide(self, view: PlannerView) -> list[Move]: ...


class StaticPlanner:
    """A fixed split of workers among pools (the disaggregated baseline): never moves."""

    name = "static"
    interval_s = 1.0

    def decide(self, view: PlannerView) -> list[Move]:
        return []
