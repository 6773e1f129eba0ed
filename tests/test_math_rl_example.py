"""examples/math_rl.py: MATH-style answers scored as their references say, and a run whose every
response is scored by the math reward, its answers decided by algebra in the checker processes,
evaluation rounds scored by the same check."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from pivotflow.run import run

EXAMPLE = Path(__file__).parents[1] / "examples" / "math_rl.py"


def test_math_style_answers_score_as_their_references_say(
        script: Callable[[Path], ModuleType]) -> None:
    module = script(EXAMPLE)
    got = module.check()
    assert got == [want for *_, want in module.CHECKS] and 1.0 in got and 0.0 in got


def radical_references(path: Path) -> Path:
    """Each row's reference rewritten as ``\\sqrt{N^2}``, which only algebra equates with the
    response's number: every answer then goes through a checker process."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        row["answer"] = f"\\sqrt{{{int(row['answer'].split('#### ')[1]) ** 2}}}"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.timeout(300)
def test_a_run_scores_every_response_and_evaluates_by_the_math_check(
        tmp_path: Path, script: Callable[[Path], ModuleType]) -> None:
    """Two steps on the built-in policy, references the algebra must decide (training and
    held-out prompts alike), held-out prompts every step (four samples each): every response
    scored (task_accuracy is the reward's check: ``write_correct``), every answer decided in a
    checker process inside the run, nothing lost; an evaluation round's accuracy is the same
    check, equal to its reward mean, with pass@k."""
    module = script(EXAMPLE)
    data = radical_references(module.write_table(tmp_path / "data.jsonl", n=64))
    held_out = radical_references(module.write_table(tmp_path / "held_out.jsonl", n=16,
                                                     seed=7))
    result = run(EXAMPLE, steps=2, out=tmp_path / "run", console=False,
                 sets=[f"graph.data={data}", f"graph.eval_data={held_out}", "eval_every=1",
                       "eval_samples=4", "eval_temperature=1.0", "live=false",
                       "planner=static"])
    assert result.summary["ledger"]["lost"] == 0 and result.summary["steps"] == 2
    records = [json.loads(line)
               for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for rec in records:
        # (logged_metrics also average the evaluation round's samples scored since the last
        # step: the records' own figures are the training samples')
        metrics = rec["logged_metrics"]
        assert rec["task_accuracy"] == pytest.approx(rec["reward_mean"])
        assert metrics["math_timeout"] == 0.0
        # the built-in policy answers with digits: a last number is there unless a response
        # is empty; each of those answers needed algebra against \sqrt{N^2}
        assert metrics["math_no_answer"] <= 0.1
        assert metrics["math_algebra"] == pytest.approx(1.0 - metrics["math_no_answer"])
    rounds = [json.loads(line)
              for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert len(rounds) >= 2
    for r in rounds:
        assert r["task_accuracy"] is not None
        assert r["task_accuracy"] == pytest.approx(r["reward_mean"])
        assert r["task_pass_at_n"] >= r["task_accuracy"]
        assert set(r["task_pass_at_k"]) >= {"1", "2"}
