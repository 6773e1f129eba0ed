"""The shipped verdict parsers: each common form a GenRM writes, and what is no verdict."""

from __future__ import annotations

import pytest

from pivotflow.verdicts import (
    boxed,
    first_of,
    last_boxed,
    parse_boxed,
    parse_score,
    parse_yes_no,
    score,
    score_parser,
    strip_thinking,
    yes_no,
)


@pytest.mark.parametrize(("text", "want"), [
    ("The answer is \\boxed{7}.", 7.0),
    ("\\boxed{0.5}", 0.5),
    ("\\boxed{-2}", -2.0),
    ("first \\boxed{1} then, on reflection, \\boxed{0}", 0.0),  # the last box counts
    ("Verdict: \\boxed{Yes}", 1.0),
    ("\\boxed{\\text{no}}", 0.0),
    ("\\boxed{ CORRECT }", 1.0),
    ("\\boxed{incorrect}", 0.0),
    ("\\boxed{\\frac{1}{2}}", None),  # not a number this parser reads
    ("\\boxed{maybe}", None),
    ("no box at all: Yes", None),
    ("\\boxed{7", None),  # never closed
    ("\\boxed{3} and \\boxed{4", 3.0),  # the last whole box
])
def test_boxed(text: str, want: float | None) -> None:
    assert boxed(text) == want


def test_last_boxed_keeps_nested_braces() -> None:
    assert last_boxed("x \\boxed{a{b}c} y") == "a{b}c"


@pytest.mark.parametrize(("text", "want"), [
    ("Yes", 1.0),
    ("85:No", 0.0),  # the built-in judge's form
    ("Is the answer right? Let me check... yes, it is.", 1.0),
    ("yes at first, but no.", 0.0),  # the final one
    ("NO", 0.0),
    ("Nothing to say", None),  # "No" inside a word is no verdict
    ("The answer is yesterday's", None),
    ("", None),
])
def test_yes_no(text: str, want: float | None) -> None:
    assert yes_no(text) == want


@pytest.mark.parametrize(("text", "scale", "want"), [
    ("Score: 7/10", None, 0.7),
    ("Rating: 0.8", None, 0.8),
    ("score = 4 / 5", None, 0.8),
    ("**Score:** 9/10", None, 0.9),
    ("Grade: 3", None, 3.0),
    ("Score: 7", 10, 0.7),
    ("Score: 2/10 ... revised Score: 6/10", None, 0.6),  # the last one
    ("Score: 11/10", None, None),  # above its maximum
    ("Score: 12", 10, None),
    ("Score: -1", None, None),
    ("Score: 3/0", None, None),
    ("no score here", None, None),
])
def test_score(text: str, scale: float | None, want: float | None) -> None:
    got = score(text, scale=scale)
    assert got == (None if want is None else pytest.approx(want))


def test_reasoning_blocks_are_not_the_verdict() -> None:
    assert strip_thinking("<think>yes? no...</think>\nYes") == "\nYes"
    assert yes_no("<think>it is no good... or is it</think> Yes") == 1.0
    assert boxed("<think>\\boxed{1}</think> so \\boxed{0}") == 0.0
    # cut off while reasoning: no verdict, whatever the reasoning said
    assert strip_thinking("<think>the answer is yes") is None
    assert yes_no("<think>the answer is yes") is None
    assert score("<think>Score: 9/10") is None


def test_parse_forms_take_the_fields_the_judge_passes() -> None:
    fields = {"prompt": "2+2=", "response": "4", "answer": "4"}
    assert parse_boxed("\\boxed{yes}", **fields) == 1.0
    assert parse_yes_no("so: No", **fields) == 0.0
    assert parse_score("Rating: 0.25", **fields) == 0.25
    assert score_parser(10)("Score: 8", **fields) == pytest.approx(0.8)
    either = first_of(boxed, yes_no)
    assert either("\\boxed{0} though I would say yes", **fields) == 0.0  # the box first
    assert either("I would say yes", **fields) == 1.0
    assert either("no verdict in this", **fields) == 0.0
    assert either("nothing", **fields) is None


@pytest.mark.timeout(30)  # (each took hours before: a scan per unclosed box, three \s* runs)
def test_a_degenerate_verdict_is_parsed_without_backtracking_for_ever() -> None:
    """A judge may write a box it never closes, or spaces without end; the controller parses
    each verdict on its loop."""
    assert last_boxed("\\boxed{" * 50_000) is None
    assert last_boxed("\\boxed{" * 50_000 + "\\boxed{7}") == "7"
    assert score("score" + " " * 200_000 + "x") is None
    assert score("Score:" + " " * 200_000 + "**7 / " + " " * 100_000 + "10") == 0.7
