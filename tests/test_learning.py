"""End to end with the built-in models: GRPO with the GenRM raises rule-checked accuracy.

The first test to ask for the built-in models bootstraps them into the cache (minutes, once);
later runs reuse them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pivotflow.metrics import read_metrics
from pivotflow.run import run

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(900)
def test_grpo_genrm_learns_end_to_end(tmp_path: Path) -> None:
    """The README's main command as it ships (the full task, default settings, 200 steps):
    through rollout workers, the judge's verdicts, GRPO and weight sync, rule-checked accuracy
    rises by the issue's 0.15 at least. Measured 0.39 -> 0.61 (+0.22) in ~35 s; the run is
    seeded and deterministic."""
    result = run(ROOT / "graphs" / "grpo_genrm.py", sets=["live=false"], out=tmp_path / "run",
                 console=False)
    s = result.summary
    assert s["steps"] == 200
    assert s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert s["ledger"]["groups_trained"] == 200 * 8
    steps = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert steps[-1]["judge_failures"] < 0.05 * 200 * 64  # the judge's verdicts parse
    assert s["task_accuracy_gain"] >= 0.15, s


def test_rloo_filter_example_runs(tmp_path: Path) -> None:
    result = run(ROOT / "examples" / "rloo_filter.py", sets=["live=false"], steps=5,
                 out=tmp_path / "rloo", console=False)
    s = result.summary
    assert s["steps"] == 5 and s["ledger"]["lost"] == 0
    # every trained group had signal; the ones without were dropped and replaced
    assert s["ledger"]["prompts_in"] == s["ledger"]["groups_trained"] + s["groups_filtered"]
    assert s["groups_filtered"] > 0
