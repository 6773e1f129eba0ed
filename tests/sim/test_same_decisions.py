"""The simulator runs the real controller and planner: a planner's decision is a pure function
of the view the controller measured, in virtual time as on the wall clock."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from pivotflow.controller.core import Controller
from pivotflow.planner import BackpressurePlanner
from pivotflow.planner.base import Move, PlannerView
from pivotflow.sim import cluster
from pivotflow.sim.cluster import Split, simulate
from pivotflow.sim.workload import Workload

sys.path.insert(0, str(Path(__file__).parents[1] / "controller"))
from harness import Harness, serving  # noqa: E402


class RecordingPlanner:
    """Wraps a planner and logs every (view, moves) it was asked and answered."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.interval_s = inner.interval_s
        self.log: list[tuple[PlannerView, list[Move]]] = []

    def decide(self, view: PlannerView) -> list[Move]:
        moves = self.inner.decide(view)
        self.log.append((view, list(moves)))
        return moves


def replay(log: list[tuple[PlannerView, list[Move]]], **kw: Any) -> list[list[Move]]:
    fresh = BackpressurePlanner(**kw)
    return [fresh.decide(view) for view, _ in log]


def test_the_simulator_drives_the_real_controller() -> None:
    assert cluster.Controller is Controller


def test_simulated_decisions_replay_from_their_views(fast_shift_workload: Workload) -> None:
    rec = RecordingPlanner(BackpressurePlanner())
    r = simulate(fast_shift_workload, rec, Split(1, 1, 6), steps=4)
    made = [m for _, moves in rec.log for m in moves]
    assert made and r.decisions == len(made)
    assert replay(rec.log) == [moves for _, moves in rec.log]


async def test_wall_clock_decisions_replay_the_same_way() -> None:
    pools = {
        "w-r0": "rollout",
        "w-r1": "rollout",
        "w-r2": "rollout",
        "w-j0": "genrm",
        "w-t": "trainer",
    }
    rec = RecordingPlanner(BackpressurePlanner(interval_s=0.01))
    h = Harness(steps=4, assignments=pools, planner=rec, group_size=8, groups_per_step=4)
    # a judge slow enough that moving a worker to it pays for the shift (measured rates)
    async with serving(h, pools, ticks={"w-j0": 0.2}) as (run, _):
        await asyncio.wait_for(run, 30)
    assert any(moves for _, moves in rec.log)
    assert replay(rec.log, interval_s=0.01) == [moves for _, moves in rec.log]
