"""Math answers taken out of responses and compared with references (``rl/math_answer.py``,
``rl/latex_expr.py``): the forms GSM8K, MATH and DAPO-Math answers come in, the spellings of
one answer that must match, and the near misses that must not."""

from __future__ import annotations

from fractions import Fraction

import pytest

from pivotflow.rl.latex_expr import NotMath, algebra_leaf, parse, same_value
from pivotflow.rl.math_answer import (
    equivalent,
    final_answer,
    last_boxed,
    normalized,
    number_of,
    plain_leaf,
    reference_answer,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(("text", "style", "want"), [
    ("so the answer is $\\boxed{\\frac{1}{2}}$.", "auto", "\\frac{1}{2}"),
    ("\\boxed{1} then \\boxed{\\{1, \\{2\\}\\}}", "boxed", "\\{1, \\{2\\}\\}"),
    ("first \\boxed{3}, finally \\fbox{4}", "boxed", "4"),
    ("we get \\boxed 5$.", "boxed", "5"),
    ("\\boxed{\\frac{1}{2}", "boxed", None),  # cut short: never closed
    ("no box here: 7", "boxed", None),
    ("She has 3 + 4 = 7 apples.\n#### 7", "auto", "7"),
    ("#### 1,234\n", "gsm8k", "1,234"),
    ("Reasoning...\nAnswer: 42\n", "auto", "42"),
    ("answer: 1\nThe final answer is: 2", "answer", "2"),
    ("3 apples and 4.5 pears.", "auto", None),  # auto never guesses a number
    ("3 apples and 4.5 pears.", "last_number", "4.5"),
    ("a total of 1,000, so", "last_number", "1,000"),
    ("nothing", "last_number", None),
])
def test_final_answer_in_each_style(text: str, style: str, want: str | None) -> None:
    assert final_answer(text, style) == want


@pytest.mark.timeout(30)  # (quadratic, the first "Answer:" pattern took ~100 s on this)
def test_a_huge_response_is_read_without_backtracking_for_ever() -> None:
    """The controller reads every response on its loop: no pattern may backtrack for ever on
    a long run of spaces (the first "Answer:" pattern took 1 s on 20k spaces, 25 s on 100k)."""
    for style in ("auto", "answer", "gsm8k", "last_number", "boxed"):
        assert final_answer("answer" + " " * 200_000 + "x\n1,", style) in (None, "1")
        final_answer("\\boxed{" * 50_000 + "#### " + " " * 100_000, style)


def test_reference_answers_come_out_of_worked_solutions() -> None:
    assert reference_answer("Natalia sold 48/2 = 24 clips.\n#### 72") == "72"
    assert reference_answer("Thus $x = \\boxed{\\frac{3}{4}}$.") == "\\frac{3}{4}"
    assert reference_answer("  17 ") == "17"
    assert last_boxed("\\boxed{a}{b}") == "a"


@pytest.mark.parametrize(("given", "want"), [
    ("$\\dfrac{1}{2}$", "\\frac{1}{2}"),
    ("\\left( 1, 2 \\right)", "(1,2)"),
    ("5 cm", "5"),
    ("12\\text{ inches}^2", "12"),
    ("\\$1,000.", "1000"),
    ("x = 3", "3"),
    ("30^\\circ", "30"),
    ("50\\%", "50%"),
    ("\\text{(B)}", "B"),
    ("(c)", "C"),
    ("\\frac12", "\\frac{1}{2}"),
    ("\\log_2 8", "\\log_2 8"),  # the space TeX needs is kept
    ("2x", "2x"),  # a variable is not a unit
    ("\\mathrm{Monday}", "Monday"),
])
def test_normalized_forms(given: str, want: str) -> None:
    assert normalized(given) == want


SAME = [
    ("0.5", "\\frac{1}{2}"), ("1/2", "\\dfrac12"), ("-\\frac{3}{4}", "-0.75"),
    ("2\\frac{1}{2}", "2.5"), ("1,000", "1000"), ("50\\%", "50"), ("50%", "0.5"),
    ("0.3333333", "\\frac{1}{3}"), ("1.5e3", "1500"), ("10 dollars", "\\$10"),
    ("\\text{B}", "(B)"), ("yes", "Yes"), ("x=3", "3"),
    ("(1,2)", "\\left(1, 2\\right)"), ("\\{2,1\\}", "\\{1,2\\}"), ("3, 1", "1, 3"),
    ("[0, \\frac12)", "[0,0.5)"),
    # only algebra says these
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt2}"), ("2\\sqrt{3}", "\\sqrt{12}"),
    ("x^2+2x+1", "(x+1)^2"), ("y=2x+1", "y = 1 + 2x"), ("\\pi/2", "\\frac{\\pi}{2}"),
    ("10^{3}", "1000"), ("\\sin^2 x + \\cos^2 x", "1"), ("\\log_2 8", "3"), ("|-3|", "3"),
    ("\\binom{5}{2}", "10"), ("5!", "120"), ("\\sqrt[3]{8}", "2"), ("x_1+x_{2}", "x_2+x_1"),
    ("2 \\cdot 3", "6"), ("(2\\sqrt2, \\pi)", "(\\sqrt{8}, \\pi)"), ("\\frac{1}{2}\\%", "0.005"),
    ("\\infty", "\\infty"), ("3\\pi", "\\pi \\times 3"),
    # forms read since the first version: x \in an interval, "and" lists, \pm, inequalities
    # either way round, matrices of any bracket
    ("x \\in [0, 1)", "[0,1)"), ("1 \\text{ and } 2", "2, 1"), ("3, \\text{or} 4", "4,3"),
    ("1 \\pm \\sqrt{2}", "1-\\sqrt2, 1+\\sqrt2"), ("x > 3", "3 < x"),
    ("x \\geq -1", "-1 \\le x"), ("x \\gt 7", "x > 7"), ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
                                 "\\begin{bmatrix}1&2\\\\3&\\sqrt{16}\\end{bmatrix}"),
]
DIFFERENT = [
    ("0.333", "\\frac{1}{3}"), ("2", "3"), ("-1", "1"), ("(1,2)", "[1,2]"), ("(1,2)", "(2,1)"),
    ("\\{1,2\\}", "\\{1,2,3\\}"), ("1, 2", "1"), ("[0,1)", "[0,1]"), ("2x", "3x"),
    ("-\\infty", "\\infty"), ("x^2", "x^3"), ("\\sqrt{2}", "1.41"), ("A", "B"),
    ("yes", "no"), ("", "1"), ("x=3", "x=4"), ("\\frac{1}{0}", "1"), ("2\\frac{1}{2}", "1"),
    ("abc!", "3"),
    ("x > 3", "x \\ge 3"), ("x < 3", "3 < x"), ("1 + \\sqrt{2}", "1 \\pm \\sqrt{2}"),
    ("\\begin{pmatrix} 1 & 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("\\begin{pmatrix} 1 & 2 \\end{pmatrix}", "(1, 2)"),
]


@pytest.mark.parametrize(("pred", "gold"), SAME)
def test_spellings_of_one_answer_are_the_same(pred: str, gold: str) -> None:
    assert equivalent(normalized(pred), normalized(gold), algebra_leaf) is True


@pytest.mark.parametrize(("pred", "gold"), DIFFERENT)
def test_near_misses_differ(pred: str, gold: str) -> None:
    assert equivalent(normalized(pred), normalized(gold), algebra_leaf) is False


def test_plain_leaf_decides_numbers_and_text_and_leaves_algebra() -> None:
    assert plain_leaf("0.5", "\\frac{1}{2}") is True
    assert plain_leaf("3", "4") is False
    assert plain_leaf("Monday", "Tuesday") is False
    assert plain_leaf("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}") is None
    # without algebra, a structure with an undecided item stays undecided
    assert equivalent("(1,\\sqrt{4})", "(1,2)") is None
    assert equivalent("(1,3)", "(1,2)") is False


def test_numbers_are_read_exactly_and_not_for_ever() -> None:
    assert number_of("0.1") == Fraction(1, 10)
    assert number_of("-3/4") == number_of("-0.75")
    assert number_of("1/0") is None
    assert number_of("9" * 100) is None  # (not read this way: algebra's, under its time limit)


def test_the_parser_never_evaluates_python() -> None:
    with pytest.raises(NotMath):
        parse("__import__('os').system('true')")
    with pytest.raises(NotMath):
        parse("\\frac{1}{")
    with pytest.raises(NotMath):
        parse("\\begin{pmatrix}1\\end{pmatrix}")
    # an unreadable item is simply not the same
    assert algebra_leaf("\\foo{1}", "1") is False
    assert same_value("2x", "x+x") is True
