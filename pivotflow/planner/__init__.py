"""Planners: static (fixed split), colocated (phases), backpressure (shifts workers where the
work is) and adaptive (backpressure that re-sizes its standing split as the workload drifts)."""

from __future__ import annotations

import msgspec

from pivotflow.errors import ConfigError
from pivotflow.planner.adaptive import AdaptivePlanner
from pivotflow.planner.backpressure import BackpressureConfig, BackpressurePlanner
from pivotflow.planner.base import Move, Planner, PlannerView, PoolView, StaticPlanner
from pivotflow.planner.colocated import ColocatedPlanner, parse_groups

PLANNERS = ("backpressure", "static", "colocated", "adaptive")


def make_planner(name: str, colocate: list[tuple[str, ...]] | None = None,
                 knobs: BackpressureConfig | None = None) -> Planner:
    """The planner called ``name``; raises ConfigError listing the valid names. ``colocate``
    (static only): groups of pools whose workers time-share them in phases; ``knobs``
    (backpressure and adaptive): their settings, else the defaults."""
    kw = msgspec.structs.asdict(knobs) if knobs is not None else {}
    if name == "static":
        if colocate and any(len(g) > 1 for g in colocate):
            return ColocatedPlanner(groups=colocate, name="static")
        return StaticPlanner()
    if name == "backpressure":
        return BackpressurePlanner(**kw)
    if name == "colocated":
        return ColocatedPlanner()
    if name == "adaptive":  # backpressure that also re-sizes its standing split (drift)
        return AdaptivePlanner(**kw)
    raise ConfigError(f"unknown planner {name!r}; valid: {', '.join(PLANNERS)}")


__all__ = ["PLANNERS", "AdaptivePlanner", "BackpressurePlanner", "ColocatedPlanner", "Move", "Planner",
           "PlannerView", "PoolView", "StaticPlanner", "make_planner", "parse_groups"]
