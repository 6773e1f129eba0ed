"""The simulator against the real runs it is calibrated on: bench/elastic.py's committed figures
(measured on the 2-core machine) and the cost figures bench/cpu_costs.py measured the same day:
3 workers (bench/results/elastic/, cpu_tiny_longtail.toml) and the bench's default of as many
workers as cores, with static partitions that time-share pools (bench/results/elastic_w2/,
cpu_tiny_longtail_w2.toml; the 2026-12-04 runs there with that sitting's costs). A change to the simulator, the controller or the planners that moves
a prediction out of 15% of what was measured fails here."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize(("costs", "runs_glob"), [
    ("bench/workloads/cpu_tiny_longtail.toml", "elastic/*.json"),
    ("bench/workloads/cpu_tiny_longtail_w2.toml", "elastic_w2/2026-12-0[13]-*.json"),
    # a sitting whose costs were measured beside its runs (before and after them)
    ("bench/results/elastic_w2/2026-12-04-costs.toml", "elastic_w2/2026-12-04-run*.json"),
    # warm roles on and off, interleaved in one sitting, each simulated as it ran
    ("bench/results/elastic_w2/warm_roles/2026-12-04-costs.toml",
     "elastic_w2/warm_roles/2026-12-04-on-run*.json"),
    ("bench/results/elastic_w2/warm_roles/2026-12-04-costs.toml",
     "elastic_w2/warm_roles/2026-12-04-off-run*.json"),
])
def test_the_simulator_predicts_the_real_planners_within_15_percent(
    bench_script: Callable[[str], ModuleType], costs: str, runs_glob: str
) -> None:
    bench = bench_script("sim_paper")
    runs = sorted(str(p) for p in (ROOT / "bench" / "results").glob(runs_glob))
    assert len(runs) >= 3
    real = bench.real_rates("", runs)
    assert set(real) == {"colocated", "static", "backpressure"}
    got = bench.calibrate(str(ROOT / costs), real, bench.static_tried(runs),
                          bench.warm_tried(runs))
    assert got["warm_roles"] == ("-on-" in runs_glob)
    for planner, row in got["planners"].items():
        assert len(row["measured_runs"]) == len(runs)
        assert abs(row["error"]) <= 0.15, (planner, row)
    # the simulated baselines sit under both bounds, the blind scheduler's the lower
    ceil = got["ceilings"]
    assert 1 < ceil["nonclairvoyant_over_static"] < ceil["fluid_over_static"]
    assert 1 < ceil["nonclairvoyant_over_colocated"] < ceil["fluid_over_colocated"]


def test_resummarize_adds_the_bounds_to_stored_runs_without_simulating(
    bench_script: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    bench = bench_script("sim_paper")
    stored = json.loads((ROOT / "bench/results/sim_paper.json").read_text())["results"][0]
    old = {k: v for k, v in stored.items() if k not in ("ceilings", "fraction_of_nonclairvoyant")}
    out = tmp_path / "results.json"
    out.write_text(json.dumps({"results": [old]}))
    assert bench.main(["--resummarize", "--out", str(out)]) == 0
    (new,) = json.loads(out.read_text())["results"]
    assert new["runs"] == old["runs"] and new["best_static"] == old["best_static"]
    nc = new["fluid"]["nonclairvoyant_samples_per_s"]
    assert new["ceilings"]["nonclairvoyant_over_best_static"] == pytest.approx(
        nc / old["best_static"], rel=1e-3)
    assert new["fraction_of_nonclairvoyant"]["backpressure"] == pytest.approx(
        old["backpressure"] / nc, rel=1e-3)
    assert (tmp_path / "results_throughput.png").stat().st_size > 1000  # with the bound drawn


def test_runs_with_and_without_warm_roles_are_not_calibrated_together(
    bench_script: Callable[[str], ModuleType]
) -> None:
    bench = bench_script("sim_paper")
    both = sorted(str(p) for p in (ROOT / "bench/results/elastic_w2/warm_roles").glob("*.json"))
    with pytest.raises(SystemExit, match="some runs kept warm roles and some did not"):
        bench.warm_tried(both)
