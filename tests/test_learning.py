"""End to end with the built-in models: GRPO with the GenRM raises rule-checked accuracy.

The first test to ask for the built-in models bootstraps them into the cache (minutes, once);
later runs reuse them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pivotflow.metrics import read_metrics
from pivotflow.run import run

ROOT = Path(__file__).resolve().parents[1]


PROBLEMS = [("47+38=", "85"), ("19+64=", "83"), ("56+29=", "85"), ("38+47=", "85")]


@pytest.mark.timeout(900)
def test_grpo_genrm_learns_end_to_end(tmp_path: Path) -> None:
    """The shipped GenRM graph on a small fixed prompt set (from a JSONL file): through rollout
    workers, the judge's verdicts, GRPO and weight sync, rule-checked accuracy must rise.

    Measured: 0.26 -> 0.49 (lr 5e-5, 40 steps). On the full task the same loop gains only
    ~0.02-0.04 in 200-600 steps (see the issue notes), too little for a test to see reliably.
    """
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in PROBLEMS))
    text = (ROOT / "graphs" / "grpo_genrm.py").read_text()
    old = 'g.source("prompts", task="arithmetic", digits=config["digits"],'
    assert old in text
    graph = tmp_path / "graph.py"
    graph.write_text(text.replace(old, f'g.source("prompts", path={str(data)!r}, '
                                       'check_with="arithmetic",'))
    result = run(graph, sets=["live=false", "graph.lr=5e-5", "graph.groups_per_step=4"],
                 steps=40, out=tmp_path / "run", console=False)
    s = result.summary
    assert s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert s["ledger"]["groups_trained"] == 40 * 4
    steps = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert steps[-1]["judge_failures"] < 0.05 * 40 * 32  # the judge's verdicts parse
    assert s["task_accuracy_gain"] > 0.1, s


def test_rloo_filter_example_runs(tmp_path: Path) -> None:
    result = run(ROOT / "examples" / "rloo_filter.py", sets=["live=false"], steps=5,
                 out=tmp_path / "rloo", console=False)
    s = result.summary
    assert s["steps"] == 5 and s["ledger"]["lost"] == 0
    # every trained group had signal; the ones without were dropped and replaced
    assert s["ledger"]["prompts_in"] == s["ledger"]["groups_trained"] + s["groups_filtered"]
    assert s["groups_filtered"] > 0
