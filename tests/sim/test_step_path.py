"""The step record's path (``admitted_s``, ``stage_done_s``, ``train_ready_s``,
``train_started_s``): where each step's time went, on the clock of ``time_s``. Checked on a
simulated run (the controller the real runs use, on a virtual clock) against the admission
quota it follows; the real-run and resume cases are in test_resume.py."""

from __future__ import annotations

import pytest

from pivotflow.sim.cluster import Split, simulate
from pivotflow.sim.workload import Workload

pytestmark = pytest.mark.timeout(120)


def assert_in_order(r: dict[str, object], stages: list[str]) -> None:
    done = r["stage_done_s"]
    assert isinstance(done, dict) and list(done) == stages
    points = [r["admitted_s"], *done.values(), r["train_ready_s"], r["train_started_s"],
              r["time_s"]]
    assert all(isinstance(t, float) for t in points), points
    assert points == sorted(points), f"step {r['step']}: out of order {points}"


def test_each_step_s_path_follows_the_admission_quota(tiny_workload: Workload) -> None:
    wl = tiny_workload
    assert wl.max_staleness == 1
    res = simulate(wl, "static", Split(2, 2, 4), steps=4)
    records = res.records
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for r in records:
        assert_in_order(r, ["rollout", "genrm"])
    # max_staleness 1: steps 1 and 2 are admitted at the start, step k when step k-2 ended
    assert records[0]["admitted_s"] == records[1]["admitted_s"] == 0.0
    for k in (2, 3):
        assert records[k]["admitted_s"] == pytest.approx(records[k - 2]["time_s"], abs=1e-9)
    # one optimizer step at a time: each begins after the one before it ended
    for before, r in zip(records, records[1:], strict=False):
        assert r["train_started_s"] >= before["time_s"] - 1e-9
    # the generation took time: its tail ends well after the admission
    assert all(r["stage_done_s"]["rollout"] > r["admitted_s"] for r in records)
