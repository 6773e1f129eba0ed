"""Arithmetic task options, the registry's errors, and dataset helpers' edge cases."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pivotflow.errors import TaskError
from pivotflow.tasks.arithmetic import ArithmeticTask, check_answer
from pivotflow.tasks.registry import (
    Problem,
    get_task,
    load_jsonl,
    make_dataset,
    register_task,
    save_jsonl,
    split_dataset,
    task_names,
)


@pytest.mark.parametrize("ops", ["+", "-", "*", "+-*"])
def test_every_op_gives_the_true_result(ops: str) -> None:
    task = get_task("arithmetic", digits=3, ops=ops)
    for p in make_dataset(task, 300, 1):
        a, b, op = p.meta["a"], p.meta["b"], p.meta["op"]
        assert p.prompt == f"{a}{op}{b}=" and 100 <= a <= 999 and 100 <= b <= 999
        assert int(p.answer) == {"+": a + b, "-": a - b, "*": a * b}[op]
        assert task.check(p, p.answer) and task.check(p.answer, f" {p.answer}\n")
    assert {p.meta["op"] for p in make_dataset(task, 300, 1)} == set(ops)


def test_negative_answers_are_canonical() -> None:
    assert check_answer("-7", "-7") and not check_answer("-7", "- 7")
    assert not check_answer("-7", "-07") and not check_answer("0", "-0")
    assert check_answer("0", "0")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"digits": 0}, "digits"),
        ({"digits": 10}, "digits"),
        ({"digits": True}, "digits"),
        ({"ops": "/"}, "ops"),
        ({"ops": ""}, "ops"),
        ({"base": 7}, "does not accept options"),
    ],
)
def test_bad_options_are_task_errors(options: dict, match: str) -> None:
    with pytest.raises(TaskError, match=match):
        get_task("arithmetic", **options)


def test_registry_lists_and_registers() -> None:
    assert "arithmetic" in task_names()
    with pytest.raises(TaskError, match="already registered"):
        register_task("arithmetic", ArithmeticTask)


def test_dataset_is_seeded_distinct_and_bounded() -> None:
    task = get_task("arithmetic", digits=1)
    a = make_dataset(task, 50, 7)
    assert a == make_dataset(task, 50, 7) and a != make_dataset(task, 50, 8)
    assert len({p.prompt for p in a}) == 50
    # 1-digit addition has only 100 distinct prompts.
    with pytest.raises(TaskError, match="only 100 distinct prompts"):
        make_dataset(task, 101, 0)
    with pytest.raises(TaskError, match=">= 0"):
        make_dataset(task, -1, 0)


def test_split_by_fraction_and_range_errors() -> None:
    probs = make_dataset(get_task("arithmetic"), 200, 0)
    train, held = split_dataset(probs, 0.25, seed=3)
    assert len(held) == 50 and len(train) == 150
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    for bad in (0.0, 1.0, 201, -1):
        with pytest.raises(TaskError, match="held_out"):
            split_dataset(probs, bad)


def test_jsonl_meta_survives_and_errors_name_the_line(tmp_path: Path) -> None:
    task = get_task("arithmetic", ops="+-")
    probs = [task.sample(random.Random(i)) for i in range(3)]
    path = tmp_path / "d.jsonl"
    save_jsonl(probs, path)
    assert load_jsonl(path) == probs
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n\nnot json\n')
    with pytest.raises(TaskError, match=rf"{path}:3: "):
        load_jsonl(path)
    assert Problem(prompt="1+1=", answer="2").meta == {}
    with pytest.raises(TaskError, match="cannot read dataset"):
        load_jsonl(tmp_path / "missing.jsonl")
