"""The simulator against the real runs it is calibrated on: bench/elastic.py's committed figures
(measured on the 2-core machine) and the cost figures bench/cpu_costs.py measured the same day:
3 workers (bench/results/elastic/, cpu_tiny_longtail.toml) and the bench's default of as many
workers as cores, with static partitions that time-share pools (bench/results/elastic_w2/,
cpu_tiny_longtail_w2.toml). A change to the simulator, the controller or the planners that moves
a prediction out of 15% of what was measured fails here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize(("workload", "results"), [("cpu_tiny_longtail", "elastic"),
                                                   ("cpu_tiny_longtail_w2", "elastic_w2")])
def test_the_simulator_predicts_the_real_planners_within_15_percent(
    bench_script: Callable[[str], ModuleType], workload: str, results: str
) -> None:
    bench = bench_script("sim_paper")
    runs = sorted(str(p) for p in (ROOT / "bench" / "results" / results).glob("*.json"))
    assert len(runs) >= 3
    real = bench.real_rates("", runs)
    assert set(real) == {"colocated", "static", "backpressure"}
    got = bench.calibrate(str(ROOT / "bench" / "workloads" / f"{workload}.toml"), real,
                          bench.static_tried(runs))
    for planner, row in got["planners"].items():
        assert len(row["measured_runs"]) == len(runs)
        assert abs(row["error"]) <= 0.15, (planner, row)
