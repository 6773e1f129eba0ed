"""The colocated baseline (verl's hybrid engine): every worker hosts the same role at a time,
in phases — all generate, then all judge, then all train — paying a shift at every switch.

Each interval the target is the first pool in pipeline order with work at it; every ready
worker of a pool with no work of its own moves there. A pool still busy keeps its workers until
its phase ends, so phases never overlap by choice.

With ``groups`` the same rule runs inside each group of pools separately, and workers never
leave their group: a static partition whose parts time-share their pools (``--set
planner=static colocate=rollout+genrm``: inference workers that roll out and judge in phases,
and trainers that only train, as slime and AReaL deploy a GenRM). It is how a static split fits
fewer workers than pools.
"""

from __future__ import annotations

from collections.abc import Sequence

from pivotflow.planner.base import Move, PlannerView, PoolView


class ColocatedPlanner:
    def __init__(self, interval_s: float = 0.02, groups: Sequence[Sequence[str]] = (),
                 name: str = "colocated") -> None:
        self.interval_s = interval_s
        self.groups = [tuple(g) for g in groups]  # empty: one group of every pool
        self.name = name

    def decide(self, view: PlannerView) -> list[Move]:
        if not self.groups:
            return self._phase(view, list(view.pools.values()))
        moves = []
        for group in self.groups:  # pipeline order within each group, as the view lists it
            moves += self._phase(view, [p for p in view.pools.values() if p.name in group])
        return moves

    def _phase(self, view: PlannerView, pools: list[PoolView]) -> list[Move]:
        target = next((p for p in pools if p.queued > 0), None)
        if target is None:
            return []
        moves = []
        for pool in pools:
            if pool.name == target.name or pool.queued > 0:
                continue
            for worker in pool.ready:
                moves.append(Move(worker, pool.name, target.name,
                                  f"phase {target.name}: {target.queued} samples at it",
                                  {"queued": float(target.queued),
                                   "shift_cost_s": view.shift_cost_s}))
        return moves


def parse_groups(spec: str, pools: Sequence[str]) -> list[tuple[str, ...]]:
    """``"rollout+genrm,trainer"`` -> ``[("rollout", "genrm"), ("trainer",)]``, each group in
    ``pools`` order; pools named nowhere are groups of their own. Raises ValueError naming an
    unknown or repeated pool."""
    groups: list[tuple[str, ...]] = []
    seen: set[str] = set()
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        names = [n.strip() for n in part.split("+")]
        for n in names:
            if n not in pools:
                raise ValueError(f"{n!r} is not a pool (pools: {', '.join(pools)})")
            if n in seen:
                raise ValueError(f"pool {n!r} is in two groups")
            seen.add(n)
        groups.append(tuple(p for p in pools if p in names))
    groups += [(p,) for p in pools if p not in seen]
    return groups
