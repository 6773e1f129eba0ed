"""The simulator against the real run it is calibrated on: bench/elastic.py's committed figures
(bench/results/elastic/, measured on the 2-core machine) and the measured cost figures of
bench/workloads/cpu_tiny_longtail.toml. A change to the simulator, the controller or the planners
that moves a prediction out of 15% of what was measured fails here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).parents[2]


def test_the_simulator_predicts_the_real_planners_within_15_percent(
    bench_script: Callable[[str], ModuleType],
) -> None:
    bench = bench_script("sim_paper")
    runs = sorted(str(p) for p in (ROOT / "bench" / "results" / "elastic").glob("*.json"))
    assert len(runs) >= 3
    real = bench.real_rates("", runs)
    assert set(real) == {"colocated", "static", "backpressure"}
    got = bench.calibrate(str(ROOT / "bench" / "workloads" / "cpu_tiny_longtail.toml"), real)
    for planner, row in got["planners"].items():
        assert len(row["measured_runs"]) == len(runs)
        assert abs(row["error"]) <= 0.15, (planner, row)
