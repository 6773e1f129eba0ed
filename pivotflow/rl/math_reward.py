"""Rewards for math answers checked against a reference: GSM8K, MATH, DAPO-Math, AIME.

``math_reward("answer")`` is an ``async def`` map stage function: it takes the final answer out
of ``completion`` (``math_answer.final_answer``: the last ``\\boxed{}`` by default), the
reference out of the sample's ``answer`` field (a worked solution's box or ``####`` answer, or
the field as it is), and writes ``reward``: ``correct`` where they are the same answer, else
``wrong`` (``no_answer`` where the completion states none, ``wrong`` unless given).

"The same answer" (``math_answer``): the same after normalizing (spacing, ``\\dfrac``, units,
``x =``, ...), or the same number (``0.5``, ``1/2``, ``\\frac{1}{2}``, ``50\\%``), or, for each
item that only algebra can decide (``\\frac{\\sqrt2}{2}`` and ``1/\\sqrt{2}``; ``(x+1)^2`` and
``x^2+2x+1``), the same sympy expression, worked out in a checker process under ``timeout_s``
(``math_checker``: a check that runs over is not equal, and is counted). Tuples and intervals
compare in order with their brackets, sets and bare lists in any order, ``a \\pm b`` as its two
answers, inequalities once both face the same way, matrices cell by cell. What it does not
read (set-builder notation, answers in words beyond a single word) compares as normalized
text.

Each step record's ``logged_metrics`` gets, averaged over its samples: ``math_correct``,
``math_no_answer`` (no answer found in the completion), ``math_algebra`` (decided in a checker
process) and ``math_timeout`` (checks that ran over or whose process died).

verl's ``math_dapo`` scores ``+1``/``-1``: ``math_reward(correct=1.0, wrong=-1.0)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pivotflow.controller.user_metrics import log_metric, recording_now
from pivotflow.rl.math_answer import (
    STYLES,
    equivalent,
    final_answer,
    normalized,
    reference_answer,
)
from pivotflow.rl.math_checker import MathCheckers
from pivotflow.stage_options import reads_fields

MAX_ANSWER_CHARS = 1000  # a "final answer" longer than this is a response's tail, not an answer


def math_reward(answer: str = "answer", *, style: str = "auto", correct: float = 1.0,
                wrong: float = 0.0, no_answer: float | None = None, workers: int = 1,
                timeout_s: float = 5.0, memory_mb: int = 2048,
                write_correct: bool = False) -> Callable[..., Any]:
    """An ``async def`` map stage function: ``completion`` and the ``answer`` field in,
    ``reward`` out (the module's docstring). ``style``: where the completion states its answer
    (``math_answer.STYLES``: ``"auto"`` takes the last ``\\boxed{}``, else GSM8K's ``####``,
    else the last ``Answer:`` line; ``"last_number"`` the last number in the text);
    ``workers``: checker processes (each answer that needs algebra takes one for up to
    ``timeout_s``; ``memory_mb`` is each one's address space); ``write_correct``: write
    ``correct`` (True or False) beside ``reward``, the field a task's own rule writes, so the
    step records' ``task_accuracy`` and the evaluation rounds' accuracy and pass@k follow this
    check (declare the stage's ``writes=["reward", "correct"]``).

    Most answers are decided without algebra, at once; one that needs it waits for a free
    checker inside its call, on the stage's ``deadline_s``: keep the stage's ``concurrency``
    within ``deadline_s / timeout_s`` times ``workers`` (the example's ``4 * workers`` calls
    wait at most 20 s under the default 60 s deadline).

    Raises ValueError (one line) for a bad argument."""
    if not isinstance(answer, str) or not answer.isidentifier():
        raise ValueError(f"math_reward: answer must name a field, got {answer!r}")
    if style not in STYLES:
        raise ValueError(f"math_reward: style must be one of {', '.join(STYLES)}, got {style!r}")
    for name, value in (("correct", correct), ("wrong", wrong), ("no_answer", no_answer)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"math_reward: {name} must be a number, got {value!r}")
    checkers = MathCheckers(workers=workers, timeout_s=timeout_s, memory_mb=memory_mb)
    missing = wrong if no_answer is None else no_answer

    async def reward(completion: str, **fields: Any) -> Any:
        reference = fields[answer]
        if reference is None:
            raise ValueError(f"math_reward: the sample's {answer!r} field is empty")
        stated = final_answer(completion, style)
        if stated is None or len(stated) > MAX_ANSWER_CHARS:
            _logged(correct=False, no_answer=True)
            return {"reward": missing, "correct": False} if write_correct else missing
        pred, gold = normalized(stated), normalized(reference_answer(str(reference)))
        same = equivalent(pred, gold)
        how = "plain"
        if same is None:
            same, how = await checkers.check(pred, gold)
        _logged(correct=bool(same), algebra=how != "plain", timeout=how in ("timeout", "error"))
        score = correct if same else wrong
        return {"reward": score, "correct": bool(same)} if write_correct else score

    reward.__signature__ = reads_fields("completion", answer)  # type: ignore[attr-defined]
    reward.__name__ = reward.__qualname__ = "math_reward"
    return reward


def _logged(*, correct: bool, no_answer: bool = False, algebra: bool = False,
            timeout: bool = False) -> None:
    """This sample's share of each ``math_*`` metric (averaged per step by the run)."""
    if not recording_now():
        return
    for name, value in (("correct", correct), ("no_answer", no_answer), ("algebra", algebra),
                        ("timeout", timeout)):
        log_metric(f"math_{name}", float(value))
