"""The GenRM text format: what the judge sees, what it must write, how a verdict is read."""

from __future__ import annotations

import random

from pivotflow.tasks.arithmetic import check_answer
from pivotflow.tasks.judge_format import (
    MAX_CANDIDATE_CHARS,
    clean_candidate,
    judge_examples,
    judge_prompt,
    judge_target,
    near_miss,
    parse_verdict,
)
from pivotflow.tasks.registry import Problem, get_task, make_dataset


def test_candidate_is_cleaned_without_turning_wrong_into_right() -> None:
    assert clean_candidate(" 85\n") == "85"
    assert clean_candidate("8\t5") == "8#5" and clean_candidate("8\u00e95") == "8#5"
    assert len(clean_candidate("9" * 100)) == MAX_CANDIDATE_CHARS
    assert clean_candidate("9" * 100, max_chars=None) == "9" * 100  # a GenRM reading it whole
    p = Problem(prompt="47+38=", answer="85")
    assert judge_target(p, "8\t5") == "85:No" and judge_target(p, "") == "85:No"
    assert judge_prompt(p.prompt, "") == "47+38=?"
    shown = judge_prompt(p.prompt, "\x00\u2603" * 40)  # one printable line, what it trained on
    assert shown == "47+38=" + "#" * MAX_CANDIDATE_CHARS + "?" and shown.isprintable()


def test_near_misses_differ_and_are_judged_no() -> None:
    rng = random.Random(0)
    for p in make_dataset(get_task("arithmetic", ops="+-"), 300, 0):
        for _ in range(5):
            wrong = near_miss(p.answer, rng)
            assert wrong != p.answer and judge_target(p, wrong) == f"{p.answer}:No"


def test_parse_verdict_accepts_only_verdicts() -> None:
    assert parse_verdict(" 85:Yes\n") == 1.0 and parse_verdict("No") == 0.0
    assert parse_verdict("1:2:No") == 0.0
    for bad in ("85:yes", "85:No!", "Yes85", "85:Ye", "\n"):
        assert parse_verdict(bad) is None


def test_examples_mix_is_seeded_and_labels_agree_with_the_checker() -> None:
    probs = make_dataset(get_task("arithmetic"), 500, 0)
    ex = judge_examples(probs, 5, per_problem=4)
    assert ex == judge_examples(probs, 5, per_problem=4) and len(ex) == 2000
    by_prompt = {p.prompt: p for p in probs}
    for e in ex:
        q, cand = e.prompt.split("=", 1)
        problem = by_prompt[q + "="]
        assert e.target == f"{problem.answer}:{'Yes' if e.correct else 'No'}"
        assert e.correct == check_answer(problem.answer, cand[:-1])
    share = sum(e.correct for e in ex) / len(ex)
    assert 0.45 < share < 0.56
    assert sum(e.kind == "garbage" for e in ex) / len(ex) > 0.07
