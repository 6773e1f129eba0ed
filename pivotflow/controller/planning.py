"""What the controller measures for its planner: per generate pool, the work still to pass it,
its per-worker service rate, the workers that can move, and the measured cost of a shift."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pivotflow.planner.base import PlannerView, PoolView

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller


def planner_view(ctl: Controller) -> PlannerView:
    """``remaining`` counts samples queued or in flight at the pool's stage or any model stage
    before it; the rate is completions per busy worker-second (a pool that has not served yet
    borrows the slowest measured rate); the shift cost is the mean of the last 8 shifts (0.5 s
    before the first)."""
    now = ctl.clock.now()
    pools: dict[str, PoolView] = {}
    upstream = 0
    for idx in sorted(ctl.edges):
        node = ctl.order[idx]
        pool = ctl.pools[node.pool or ""]
        upstream += len(ctl.edges[idx]) + ctl.inflight[idx]
        busy = ctl.pool_busy_s[pool.name] + sum(
            now - since for wid, (p, since) in ctl.busy_since.items() if p == pool.name)
        rate = ctl.pool_done[pool.name] / busy if busy > 0 else 0.0
        ready = [w for w in pool.workers if ctl.workers[w].state == "ready"
                 and w not in ctl.shifts.active]
        pools[pool.name] = PoolView(pool.name, ready, len(pool.workers), upstream, rate)
    rates = [p.per_worker_rate for p in pools.values() if p.per_worker_rate > 0]
    for name, p in pools.items():  # a pool that has not served yet borrows a rate
        if p.per_worker_rate == 0 and rates:
            pools[name] = PoolView(p.name, p.ready, p.workers, p.remaining, min(rates))
    done = [r.total_s for r in ctl.shifts.done if r.total_s is not None]
    cost = sum(done[-8:]) / len(done[-8:]) if done else 0.5
    last = {r.worker_id: r.started_s + ctl.started_at for r in ctl.shifts.done}
    return PlannerView(now, pools, cost, last)

