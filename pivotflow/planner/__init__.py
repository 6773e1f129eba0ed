"""Planners: static (fixed split), colocated (phases) and backpressure (shifts workers where the
work is)."""

from __future__ import annotations

from pivotflow.errors import ConfigError
from pivotflow.planner.backpressure import BackpressurePlanner
from pivotflow.planner.base import Move, Planner, PlannerView, PoolView, StaticPlanner
from pivotflow.planner.colocated import ColocatedPlanner

PLANNERS = ("backpressure", "static", "colocated")


def make_planner(name: str) -> Planner:
    """The planner called ``name``; raises ConfigError listing the valid names."""
    if name == "static":
        return StaticPlanner()
    if name == "backpressure":
        return BackpressurePlanner()
    if name == "colocated":
        return ColocatedPlanner()
    raise ConfigError(f"unknown planner {name!r}; valid: {', '.join(PLANNERS)}")


__all__ = ["PLANNERS", "BackpressurePlanner", "ColocatedPlanner", "Move", "Planner",
           "PlannerView", "PoolView", "StaticPlanner", "make_planner"]
