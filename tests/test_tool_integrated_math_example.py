"""examples/tool_integrated_math.py: each task's reference program, run through the code
interpreter in the sandbox, prints what the math reward scores 1.0; a run on a Hugging Face
folder has the tool wired into its turns and scores every final answer."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from pivotflow.run import run

EXAMPLE = Path(__file__).parents[1] / "examples" / "tool_integrated_math.py"


@pytest.mark.timeout(120)
def test_each_reference_program_prints_the_answer(tmp_path: Path,
                                                  script: Callable[[Path], ModuleType]) -> None:
    module = script(EXAMPLE)
    assert module.check(module.write_tasks(tmp_path / "tasks.jsonl")) == [1.0] * len(module.TASKS)


@pytest.mark.timeout(300)
def test_a_run_scores_every_final_answer(tmp_path: Path,
                                         script: Callable[[Path], ModuleType]) -> None:
    """Two steps on the byo example's tiny random Qwen2, in Qwen2.5-Math's python-block format
    (the Hermes format's turns: tests/controller/test_tool_turns.py): nothing lost, every
    sample scored by the math reward (a random model states no answer), the tool figures in
    every record."""
    module = script(EXAMPLE)
    model = script(EXAMPLE.with_name("byo_model.py")).build_tiny_folder(tmp_path / "model")
    tasks = module.write_tasks(tmp_path / "tasks.jsonl", "python_block")
    result = run(EXAMPLE, steps=2, out=tmp_path / "run", console=False,
                 sets=[f"graph.model={model}", f"graph.prompts={tasks}", "live=false",
                       "planner=static", "graph.tool_parser=python_block"])
    assert result.summary["ledger"]["lost"] == 0 and result.summary["steps"] == 2
    records = [json.loads(line)
               for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for rec in records:
        metrics = rec["logged_metrics"]
        assert metrics["math_correct"] + metrics["math_no_answer"] <= 1.0
        assert rec["reward_mean"] == pytest.approx(metrics["math_correct"])
        assert {"tool_calls_per_sample", "tool_use_rate", "tool_errors", "turns_mean"} <= set(rec)
