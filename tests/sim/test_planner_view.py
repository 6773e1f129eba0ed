"""What the controller shows its planner, checked in virtual time against what it then does."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pivotflow.planner.base import Move, PlannerView
from pivotflow.sim.cluster import Split, simulate
from pivotflow.sim.workload import load_workload

CPU = Path(__file__).parents[2] / "bench/workloads/cpu_tiny_longtail.toml"


class Watcher:
    """A planner that never moves and counts the intervals in a row showing a batch waiting
    at the trainer pool while its trainer sits idle (one is the instant a batch completes,
    before the controller starts the step; two in a row is a batch the step cannot take)."""

    name = "static"
    interval_s = 0.01

    def __init__(self) -> None:
        self.seen = 0
        self.stuck = 0
        self._last = False

    def decide(self, view: PlannerView) -> list[Move]:
        trainer = view.pools["trainer"]
        shown = bool(trainer.queued and trainer.ready)
        self.seen += bool(trainer.queued)
        self.stuck += shown and self._last
        self._last = shown
        return []


def test_a_batch_shown_waiting_is_one_the_step_can_take() -> None:
    # With max_staleness > 0 enough samples may be ready while an older group that must be in
    # the step still generates: that batch cannot start, so it must not look ready (the
    # backpressure planner lent trainers to it and took them back every interval).
    w = dataclasses.replace(load_workload(CPU), max_staleness=1)
    watcher = Watcher()
    simulate(w, watcher, Split(1, 1, 1), steps=8)
    assert watcher.seen > 0  # steps ran and were seen
    assert watcher.stuck == 0
