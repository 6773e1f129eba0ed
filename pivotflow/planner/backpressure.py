"""The backpressure planner: move a worker where it shortens the work in flight the most, when
the time it saves pays for the shift.

Model: pool ``i`` with ``n_i`` workers, each completing ``mu_i`` samples/s when busy, still has
``R_i`` samples to process (queued at it, in flight at it, or upstream of it in admitted work).
On its own it needs ``T_i = R_i / (n_i mu_i)``; the pipeline's work cannot finish before
``max_i T_i``. Moving one worker from ``s`` to ``d`` changes ``n_s`` and ``n_d``; the gain is
the drop in ``max_i T_i``. The move is made only when ``gain > shift_cost * (1 + hysteresis)``,
the worker has not moved within ``cooldown`` shift-costs, and only one move per interval.
"""

from __future__ import annotations

import math

from pivotflow.planner.base import Move, PlannerView, PoolView


def drain_time(pool: PoolView, workers: int) -> float:
    """Seconds pool needs for its remaining samples with ``workers`` workers."""
    if pool.remaining == 0:
        return 0.0
    if workers <= 0:
        return math.inf
    return pool.remaining / (workers * max(pool.per_worker_rate, 1e-9))


def makespan(view: PlannerView, sizes: dict[str, int]) -> float:
    return max((drain_time(p, sizes[n]) for n, p in view.pools.items()), default=0.0)


class BackpressurePlanner:
    name = "backpressure"

    def __init__(self, interval_s: float = 0.25, hysteresis: float = 0.5,
                 cooldown_costs: float = 4.0) -> None:
        self.interval_s = interval_s
        self.hysteresis = hysteresis
        self.cooldown_costs = cooldown_costs

    def decide(self, view: PlannerView) -> list[Move]:
        sizes = {n: p.workers for n, p in view.pools.items()}
        now = makespan(view, sizes)
        best: Move | None = None
        best_gain = view.shift_cost_s * (1 + self.hysteresis)
        for src in view.pools.values():
            movable = [w for w in src.ready
                       if view.now_s - view.last_shift_s.get(w, -math.inf)
                       > self.cooldown_costs * view.shift_cost_s]
            if not movable:
                continue
            for dst in view.pools.values():
                if dst.name == src.name or dst.remaining == 0:
                    continue
                after = dict(sizes)
                after[src.name] -= 1
                after[dst.name] += 1
                gain = now - makespan(view, after)
                if gain > best_gain:
                    best_gain = gain
                    best = Move(movable[-1], src.name, dst.name,
                                f"drain bound {now:.3f}s -> {now - gain:.3f}s, shift costs "
                                f"{view.shift_cost_s:.3f}s",
                                {"makespan_s": now, "gain_s": gain,
                                 "shift_cost_s": view.shift_cost_s,
                                 f"remaining_{src.name}": src.remaining,
                                 f"remaining_{dst.name}": dst.remaining,
                                 f"rate_{src.name}": src.per_worker_rate,
                                 f"rate_{dst.name}": dst.per_worker_rate})
        return [best] if best is not None else []
