"""End to end, agentic: the tool policy calls the calculator through real workers, a real tool
pool and the GenRM; trajectories keep their masks through training and a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from pivotflow.metrics import read_metrics
from pivotflow.run import run

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(600)
def test_agentic_graph_calls_tools_and_trains(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run(ROOT / "graphs" / "agentic_tools.py",
                 sets=["live=false", "graph.groups_per_step=4", "checkpoint_every=3"], steps=4,
                 out=out, console=False)
    s = result.summary
    assert s["steps"] == 4 and s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    steps = read_metrics(out / "metrics.jsonl")
    calls = [r["tool_calls_per_sample"] for r in steps]
    assert all(0 <= c <= 2 for c in calls) and sum(calls) > 0  # some samples called
    assert all(1 <= r["turns_mean"] <= 3 for r in steps)
    assert all(r["tool_errors"] >= 0 for r in steps)
    assert s["tool_results"].get("ok", 0) > 0  # the pool's counters reach the summary
    assert (out / "checkpoints" / "step-000003").is_dir()
