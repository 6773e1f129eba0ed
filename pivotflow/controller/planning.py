"""What the controller measures for its planner: per pool, the work still to pass it, the work
at it now, its per-worker service rate, the workers that can move, and the measured cost of a
shift."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pivotflow.planner.base import PlannerView, PoolView

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller


SHIFT_COST_PRIOR_S = 0.1  # until the first shift is measured


def _rate(ctl: Controller, pool: str, now: float) -> float:
    """Completions per busy worker-second (0 before the pool has served)."""
    busy = ctl.pool_busy_s[pool] + sum(
        now - since for wid, (p, since) in ctl.busy_since.items() if p == pool)
    return ctl.pool_done[pool] / busy if busy > 0 else 0.0


def _movable(ctl: Controller, pool: str) -> list[str]:
    return [w for w in ctl.pools[pool].workers
            if ctl.workers[w].state == "ready" and not ctl.workers[w].training
            and w not in ctl.shifts.active]


def planner_view(ctl: Controller) -> PlannerView:
    """``remaining`` counts samples queued or in flight at the pool's stage or any model stage
    before it (for the trainer pool: admitted samples not trained nor in the step running); a pool that has not
    served yet borrows the slowest measured rate; the shift cost is the mean of the last 8
    shifts (``SHIFT_COST_PRIOR_S`` before the first)."""
    now = ctl.clock.now()
    pools: dict[str, PoolView] = {}
    upstream = 0
    for idx in sorted(ctl.edges):
        pool = ctl.pools[ctl.order[idx].pool or ""]
        here = len(ctl.edges[idx]) + ctl.inflight[idx]
        upstream += here
        pools[pool.name] = PoolView(pool.name, _movable(ctl, pool.name), len(pool.workers),
                                    upstream, _rate(ctl, pool.name, now), "generate", here)
    # The trainer pool: a step in flight cannot use workers that join now, so its work counts
    # only what is still to come; ``queued`` is a complete batch waiting, or the step running.
    tpool = ctl.training.pool
    size = ctl.source.group_size
    ready = sum(len(g) for g in ctl.train_buffer.ready.values())
    untrained = len(ctl.train_buffer.open) * size
    batch = ctl.source.groups_per_step * size
    queued = ready if ready >= batch else 0
    pools[tpool] = PoolView(tpool, _movable(ctl, tpool), len(ctl.pools[tpool].workers),
                            untrained, _rate(ctl, tpool, now), "train",
                            len(ctl.training.samples()) or queued)
    rates = [p.per_worker_rate for p in pools.values() if p.per_worker_rate > 0]
    for name, p in pools.items():  # a pool that has not served yet borrows a rate
        if p.per_worker_rate == 0 and rates:
            pools[name] = PoolView(p.name, p.ready, p.workers, p.remaining, min(rates), p.role,
                                   p.queued)
    done = [r.total_s for r in ctl.shifts.done if r.total_s is not None]
    if not done:  # start-up loads are no guide (imports, all workers at once): a prior
        done = [SHIFT_COST_PRIOR_S]
    cost = sum(done[-8:]) / len(done[-8:])
    last = {r.worker_id: r.started_s + ctl.started_at for r in ctl.shifts.done}
    return PlannerView(now, pools, cost, last)
