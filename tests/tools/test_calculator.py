"""The built-in calculator evaluates arithmetic and nothing else."""

from __future__ import annotations

import pytest

from pivotflow.tools.builtin import calculator, evaluate


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ("2 + 3 * 4", "14"),
        ("(12 + 7) * 31", "589"),
        ("7 / 2", "3.5"),
        ("7 // 2", "3"),
        ("-3 ** 2", "-9"),
        ("2 ** 100", str(2**100)),
        ("10 % 4", "2"),
        ("6 / 3", "2"),
        ("1 / 3", "0.333333333333"),
        ("123456789 * 987654321", str(123456789 * 987654321)),
    ],
)
def test_values(expr: str, want: str) -> None:
    assert calculator(expression=expr) == want


@pytest.mark.parametrize(
    ("expr", "match"),
    [
        ("__import__('os')", "unsupported syntax Call"),
        ("x + 1", "unsupported syntax Name"),
        ("(1).real", "unsupported syntax Attribute"),
        ("'a' * 3", "unsupported syntax Constant"),
        ("2 ** 100000", "exponent 100000 is over 1024"),
        ("(2 ** 1000) ** 1000", "too large"),
        ("9 ** 1000 * 9 ** 1000 * 9 ** 1000 * 9 ** 1000 * 9 ** 1000", "too large"),
        ("1 +", "not an arithmetic expression"),
        ("1" * 300, "the limit is 256"),
        ("1e308 * 10", "not a finite number"),
    ],
)
def test_rejects(expr: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        evaluate(expr)


def test_division_by_zero() -> None:
    with pytest.raises(ZeroDivisionError):
        evaluate("1 / (2 - 2)")
