"""``bench/sim_gap.py``: where a simulated run's GPU time goes, every sample counted once."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest
from sim_workloads import tiny

from pivotflow.sim.cluster import Split


@pytest.mark.timeout(300)
def test_the_gpu_time_shares_cover_the_run_and_the_work_share_is_a_fraction(
    bench_script: Callable[[str], ModuleType],
) -> None:
    gap = bench_script("sim_gap")
    wl = tiny(steps=5)
    got = gap.decompose(wl, "backpressure", Split(3, 3, 2), 5, 0.5)
    shares = got["gpu_time_share"]
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-3)
    assert {"rollout_filled", "genrm_filled", "train"} <= set(shares)
    assert 0 < got["work_share"] <= 1.0
    # (samples over the steps after the first, as the bounds take them)
    assert 0 < got["fraction_of_nonclairvoyant"] <= 1.0
    # each step's path: the gaps in order, none negative
    paths = got["path_s"]["per_step"]
    assert len(paths) == 4 and list(paths[0]) == [
        "admitted->rollout", "rollout->genrm", "genrm->ready", "ready->started", "started->done"]
    assert all(g >= 0 for p in paths for g in p.values())
    assert got["path_s"]["mean"]["started->done"] > 0  # training takes time

