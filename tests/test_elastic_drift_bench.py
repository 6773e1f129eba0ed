"""bench/elastic.py --drift's bookkeeping (bench/elastic_drift.py), without real processes: the
runs are faked (metrics.jsonl written by a stub of ``elastic.one_run``), the bounds and the
simulated counterparts are real. No timing is asserted."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from conftest import load_bench_script


def test_regimes_are_the_schedules_flat_steps() -> None:
    ed = load_bench_script("elastic_drift")
    assert ed.regimes(ed.DRIFT, 12) == {"early": [1, 2, 3, 4], "late": [8, 9, 10, 11]}
    assert ed.regimes(ed.DRIFT, 3) == {"early": [1, 2], "late": []}


def test_drift_json_keys(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    ed = load_bench_script("elastic_drift")
    calls: list[tuple[str, list[str]]] = []

    def fake_run(graph: Path, out: Path, planner: str, steps: int, workers: int | None,
                 extra: list[str]) -> dict[str, Any]:
        calls.append((planner, extra))
        out.mkdir(parents=True)
        per = 1.0 + 0.1 * len(calls)  # seconds a step: each run its own rate
        recs = [{"step": k + 1, "samples": 64, "time_s": per * (k + 1)} for k in range(steps)]
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        return {"samples_per_s": ed.elastic.steady_rate(out), "shifts": 1, "migrations": 0,
                "ledger": {"lost": 0, "duplicates": 0}, "shift_records": [], "accuracy": []}

    monkeypatch.setattr(ed.elastic, "one_run", fake_run)
    args = argparse.Namespace(drift_steps=6, workers=2, out=tmp_path / "o",
                              json=tmp_path / "r" / "drift.json", no_adaptive=False)
    assert ed.main(args, ["bench/elastic.py", "--drift"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("carried_over_over_early_static", "vs_best_static", "vs_colocated",
                "fraction_of_nonclairvoyant", "samples_per_s", "static_splits", "lost",
                "duplicates", "shifts", "command", "date", "bounds", "simulated"):
        assert key in got, key
    assert set(got["samples_per_s"]) >= {"colocated", "static_best", "backpressure",
                                         "static_early_tuned", "backpressure_carried_over"}
    assert got["regimes"] == {"early": [2, 3, 4, 5], "late": []}
    # every run carries the schedule; backpressure starts from the early split's pool sizes
    assert all(any(s.startswith("graph.schedule=") for s in extra) for _, extra in calls)
    carried = [extra for planner, extra in calls if planner == "backpressure"][0]
    assert not any(s.startswith("colocate=") for s in carried)
    assert json.loads((tmp_path / "r" / "drift.json").read_text()) == got
    assert (tmp_path / "r" / "elastic_drift.png").stat().st_size > 0
    # several sittings combined: medians, the baselines chosen again on them
    both = ed.combine([tmp_path / "r" / "drift.json"] * 2)
    assert both["runs"] == 2 and both["static_early_tuned_split"] == got["static_early_tuned_split"]
    assert both["carried_over_over_early_static"] == got["carried_over_over_early_static"]
    assert both["samples_per_s_per_regime"]["colocated"]["whole_runs"] == [
        round(got["samples_per_s"]["colocated"], 2)] * 2
