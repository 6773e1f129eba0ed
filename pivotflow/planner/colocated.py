"""The colocated baseline (verl's hybrid engine): every worker hosts the same role at a time,
in phases — all generate, then all judge, then all train — paying a shift at every switch.

Each interval the target is the first pool in pipeline order with work at it; every ready
worker of a pool with no work of its own moves there. A pool still busy keeps its workers until
its phase ends, so phases never overlap by choice.
"""

from __future__ import annotations

from pivotflow.planner.base import Move, PlannerView


class ColocatedPlanner:
    name = "colocated"

    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s

    def decide(self, view: PlannerView) -> list[Move]:
        target = next((p for p in view.pools.values() if p.queued > 0), None)
        if target is None:
            return []
        moves = []
        for pool in view.pools.values():
            if pool.name == target.name or pool.queued > 0:
                continue
            for worker in pool.ready:
                moves.append(Move(worker, pool.name, target.name,
                                  f"phase {target.name}: {target.queued} samples at it",
                                  {"queued": float(target.queued),
                                   "shift_cost_s": view.shift_cost_s}))
        return moves
