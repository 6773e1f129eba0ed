"""bench/elastic.py --drift's bookkeeping (bench/elastic_drift.py) on what it recorded: the
schedule's regimes, and the real sittings' JSON and their combination. No timing is asserted."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_regimes_are_the_schedules_flat_steps(
        bench_script: Callable[[str], ModuleType]) -> None:
    ed = bench_script("elastic_drift")
    assert ed.regimes(ed.DRIFT, 12) == {"early": [1, 2, 3, 4], "late": [8, 9, 10, 11]}
    assert ed.regimes(ed.DRIFT, 3) == {"early": [1, 2], "late": []}


def test_the_recorded_sittings_have_every_key_and_combine_to_the_recorded_medians(
        bench_script: Callable[[str], ModuleType]) -> None:
    """The five real sittings in bench/results/elastic_drift/ (each ~7 min of real runs, too
    long for the suite): every key the issue asks for, nothing lost or duplicated, and
    ``combine`` gives back the combined file that was written from them."""
    ed = bench_script("elastic_drift")
    results = ROOT / "bench" / "results" / "elastic_drift"
    runs = sorted(results.glob("2026-12-03-run*.json"))
    assert len(runs) == 5
    for path in runs:
        got = json.loads(path.read_text())
        for key in ("carried_over_over_early_static", "vs_best_static", "vs_colocated",
                    "fraction_of_nonclairvoyant", "samples_per_s", "static_splits", "lost",
                    "duplicates", "shifts", "command", "date", "bounds", "simulated"):
            assert key in got, (path.name, key)
        assert set(got["samples_per_s"]) >= {"colocated", "static_best", "backpressure",
                                             "static_early_tuned", "backpressure_carried_over"}
        assert set(got["lost"].values()) == {0} and set(got["duplicates"].values()) == {0}
    recorded = json.loads((results / "2026-12-03-combined.json").read_text())
    both = ed.combine(runs)
    assert both["runs"] == 5
    for key in ("static_early_tuned_split", "static_best_split", "carried_over_over_early_static",
                "vs_best_static", "vs_colocated", "samples_per_s_per_regime"):
        assert both[key] == recorded[key], key


def test_warm_and_cold_sittings_are_not_combined(
        bench_script: Callable[[str], ModuleType]) -> None:
    ed = bench_script("elastic_drift")
    results = ROOT / "bench" / "results" / "elastic_drift"
    pair = [results / "2026-12-04-cold.json", results / "2026-12-04-warm.json"]
    assert [json.loads(p.read_text())["warm_roles"] for p in pair] == [False, True]
    with pytest.raises(SystemExit, match="some runs kept warm roles and some did not"):
        ed.combine(pair)
