"""Planners: static (fixed split), colocated (phases) and backpressure (shifts workers where the
work is)."""

from __future__ import annotations

from pivotflow.errors import ConfigError
from pivotflow.planner.backpressure import BackpressurePlanner
from pivotflow.planner.base import Move, Planner, PlannerView, PoolView, StaticPlanner
from pivotflow.planner.colocated import ColocatedPlanner, parse_groups

PLANNERS = ("backpressure", "static", "colocated")


def make_planner(name: str, colocate: list[tuple[str, ...]] | None = None) -> Planner:
    """The planner called ``name``; raises ConfigError listing the valid names. ``colocate``
    (static only): groups of pools whose workers time-share them in phases."""
    if name == "static":
        if colocate and any(len(g) > 1 for g in colocate):
            return ColocatedPlanner(groups=colocate, name="static")
        return StaticPlanner()
    if name == "backpressure":
        return BackpressurePlanner()
    if name == "colocated":
        return ColocatedPlanner()
    raise ConfigError(f"unknown planner {name!r}; valid: {', '.join(PLANNERS)}")


__all__ = ["PLANNERS", "BackpressurePlanner", "ColocatedPlanner", "Move", "Planner",
           "PlannerView", "PoolView", "StaticPlanner", "make_planner", "parse_groups"]
