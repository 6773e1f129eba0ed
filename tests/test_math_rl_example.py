"""examples/math_rl.py: MATH-style answers scored as their references say, and runs whose every
response is scored by the math reward, with its answers decided plainly or by algebra in the
checker processes."""

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
    assert module.check() == [want for *_, want in module.CHECKS]
    assert 1.0 in module.check() and 0.0 in module.check()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("references", ["worked", "radicals"])
def test_a_run_scores_every_response_with_the_math_reward(
        tmp_path: Path, script: Callable[[Path], ModuleType], references: str) -> None:
    """Two steps on the built-in policy: every response scored (the reward is the share
    correct), nothing lost. ``radicals``: each reference rewritten as ``\\sqrt{N^2}``, which
    only algebra equates with the response's number, so every answer goes through a checker
    process inside the run."""
    module = script(EXAMPLE)
    data = module.write_table(tmp_path / "data.jsonl", n=64)
    if references == "radicals":
        rows = [json.loads(line) for line in data.read_text().splitlines()]
        for row in rows:
            row["answer"] = f"\\sqrt{{{int(row['answer'].split('#### ')[1]) ** 2}}}"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run(EXAMPLE, steps=2, out=tmp_path / "run", console=False,
                 sets=[f"graph.data={data}", "live=false", "planner=static"])
    assert result.summary["ledger"]["lost"] == 0 and result.summary["steps"] == 2
    records = [json.loads(line)
               for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for rec in records:
        metrics = rec["logged_metrics"]
        assert rec["reward_mean"] == pytest.approx(metrics["math_correct"])
        assert rec["task_accuracy"] == pytest.approx(metrics["math_correct"])  # (write_correct)
        assert metrics["math_timeout"] == 0.0
        # the built-in policy answers with digits: a last number is always there, unless a
        # response is empty
        assert metrics["math_no_answer"] <= 0.1
        if references == "radicals":
            assert metrics["math_algebra"] == pytest.approx(1.0 - metrics["math_no_answer"])
        else:
            assert metrics["math_algebra"] == 0.0


@pytest.mark.timeout(300)
def test_evaluation_rounds_score_by_the_math_check(tmp_path: Path,
                                                   script: Callable[[Path], ModuleType]) -> None:
    """Held-out prompts every step, four samples each: a round's accuracy is the reward's
    check (``write_correct``; no task rule reads these answers), its reward mean the same,
    and pass@k is there."""
    module = script(EXAMPLE)
    data = module.write_table(tmp_path / "data.jsonl", n=64)
    held_out = module.write_table(tmp_path / "held_out.jsonl", n=16, seed=7)
    result = run(EXAMPLE, steps=2, out=tmp_path / "run", console=False,
                 sets=[f"graph.data={data}", f"graph.eval_data={held_out}", "eval_every=1",
                       "eval_samples=4", "eval_temperature=1.0", "live=false",
                       "planner=static"])
    assert result.summary["ledger"]["lost"] == 0
    rounds = [json.loads(line)
              for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert len(rounds) >= 2
    for r in rounds:
        assert r["task_accuracy"] is not None
        assert r["task_accuracy"] == pytest.approx(r["reward_mean"])
        assert r["task_pass_at_n"] >= r["task_accuracy"]
        assert set(r["task_pass_at_k"]) >= {"1", "2"}
