"""``bench/sim_tail.py``: the responses that reach the length cap, counted and timed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType

import pytest
from sim_workloads import tiny

from pivotflow.sim.cluster import Split
from pivotflow.sim.sim_roles import SimGenerateRole
from pivotflow.sim.workload import Lengths


def test_the_capped_share_is_the_capped_log_normals(
        bench_script: Callable[[str], ModuleType]) -> None:
    tail = bench_script("sim_tail")
    # a cap at the 99th percentile: 1% of responses reach it
    assert tail.capped_share(Lengths(1000, 10.0, 10000, "engine")) == pytest.approx(0.01)
    assert tail.capped_share(Lengths(1000, 10.0, 1000, "engine")) == pytest.approx(0.5)
    assert tail.capped_share(Lengths(1000, 1.0, 500, "engine")) == 1.0  # every one the median
    assert tail.capped_share(Lengths(1000, 1.0, 2000, "engine")) == 0.0


@pytest.mark.timeout(300)
def test_capped_sequences_are_counted_and_never_decode_faster_than_alone(
        bench_script: Callable[[str], ModuleType]) -> None:
    tail = bench_script("sim_tail")
    add, step = SimGenerateRole.add, SimGenerateRole.step
    wl = tiny(steps=4)
    wl = dataclasses.replace(wl, response=dataclasses.replace(wl.response, cap=400))
    got = tail.probe_run(wl, "backpressure", Split(3, 3, 2), 4)
    assert (SimGenerateRole.add, SimGenerateRole.step) == (add, step)  # the patch is undone
    expected = got["capped_share_expected"]
    assert 0.15 < expected < 0.35  # (median 200, p99 10x: a cap at 2x the median)
    # 128 responses drawn: the measured share within four binomial deviations of it
    assert got["capped_share"] == pytest.approx(expected, abs=4 * (expected / 128) ** 0.5)
    assert got["groups_with_capped_expected"] == pytest.approx(1 - (1 - expected) ** 4, abs=1e-3)
    assert 0 < got["capped_whole_life"] <= round(got["capped_share"] * 128)
    # a replica's decode step is never faster than with the one sequence alone on it
    assert got["per_token_ms"] >= got["alone_per_token_ms"] > 0
    assert got["life_s"] > 0 and len(got["step_times_s"]) == 4
