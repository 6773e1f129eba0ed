"""Multi-digit arithmetic: the kit's default verifiable task ("47+38=" -> "85").

The policy sees the prompt as raw text and must write the answer's digits, then EOS.
"""

from __future__ import annotations

import operator
import random
import re
from collections.abc import Callable, Sequence
from typing import ClassVar

from pivotflow.errors import TaskError
from pivotflow.tasks.registry import Problem

_OPS: dict[str, Callable[[int, int], int]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
}
# Canonical integer text: optional minus, no leading zeros, no "-0".
_CANONICAL = re.compile(r"-?[1-9][0-9]*|0")


def check_answer(answer: str, completion: str) -> bool:
    """The exact rule: after stripping surrounding whitespace, ``completion`` must be the
    canonical decimal text of the integer ``answer``.

    So with answer "85": "85", " 85\\n" are right; "085", "+85", "8 5", "85.0", "" are wrong
    (only one spelling of a number counts, which keeps the judge's Yes/No learnable).
    """
    text = completion.strip()
    return _CANONICAL.fullmatch(text) is not None and text == answer


class ArithmeticTask:
    """``digits``-digit operands joined by one of ``ops`` ("+", "-", "*"; a string like "+-"
    or a sequence), prompt ``f"{a}{op}{b}="``, answer the exact integer result."""

    name: ClassVar[str] = "arithmetic"

    def __init__(self, digits: int = 2, ops: str | Sequence[str] = "+") -> None:
        """Raises TaskError for digits outside 1..9 or an unknown or empty set of ops."""
        if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= 9:
            raise TaskError(f"arithmetic option digits must be an int in 1..9, got {digits!r}")
        chosen = tuple(ops)
        bad = [op for op in chosen if op not in _OPS]
        if not chosen or bad:
            raise TaskError(
                f"arithmetic option ops must be a non-empty subset of {''.join(_OPS)!r}, "
                f"got {ops!r}"
            )
        self.digits = digits
        self.ops = tuple(dict.fromkeys(chosen))  # drop duplicates, keep order
        self._lo = 10 ** (digits - 1) if digits > 1 else 0
        self._hi = 10**digits - 1

    def __repr__(self) -> str:
        return f"ArithmeticTask(digits={self.digits}, ops={''.join(self.ops)!r})"

    def sample(self, rng: random.Random) -> Problem:
        """Draw operands uniformly among ``digits``-digit numbers and an op uniformly."""
        a = rng.randint(self._lo, self._hi)
        b = rng.randint(self._lo, self._hi)
        op = self.ops[0] if len(self.ops) == 1 else rng.choice(self.ops)
        return Problem(
            prompt=f"{a}{op}{b}=",
            answer=str(_OPS[op](a, b)),
            meta={"a": a, "b": b, "op": op},
        )

    def check(self, problem: Problem | str, completion: str) -> bool:
        """`check_answer` against ``problem.answer`` (or the answer string itself)."""
        answer = problem.answer if isinstance(problem, Problem) else problem
        return check_answer(answer, completion)
