"""The generative judge's (GenRM's) text format, and its training pairs.

The judge reads a question and a candidate answer and *generates* its verdict after a one-step
chain of thought, the value it computes itself::

    prompt  "47+38=84?"      (raw text, no chat template, like every prompt of the kit)
    target  "85:No"          (then EOS)

`parse_verdict` turns the generated text into a reward: 1.0 for Yes, 0.0 for No, and None when
the text is not a verdict, which the controller counts as a failed judgement, never as 0.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

import msgspec

from pivotflow.tasks.arithmetic import check_answer
from pivotflow.tasks.registry import Problem

# Longer than any answer of the built-in arithmetic (9-digit products have 18 digits), so a
# truncated candidate can never look right.
MAX_CANDIDATE_CHARS = 24
# Printable ASCII without newline: a candidate is shown on the judge's one line. (The judge's
# byte-level tokenizer could encode anything; the rule keeps what it reads what it trained on.)
PRINTABLE = "".join(chr(c) for c in range(32, 127))
_SHOWN = frozenset(PRINTABLE)
_VERDICT = re.compile(r"(?:.*:)?\s*(Yes|No)", re.DOTALL)


def clean_candidate(candidate: str, max_chars: int | None = MAX_CANDIDATE_CHARS) -> str:
    """The candidate as the judge sees it: surrounding whitespace stripped (the checker strips
    too), each character outside printable ASCII replaced by "#", cut to MAX_CANDIDATE_CHARS.

    Replacing rather than dropping keeps a wrong answer wrong: dropping would turn "8\\t5" into
    "85".
    """
    text = "".join(c if c in _SHOWN else "#" for c in candidate.strip())
    return text if max_chars is None else text[:max_chars]


def judge_prompt(problem_prompt: str, candidate: str,
                 max_chars: int | None = MAX_CANDIDATE_CHARS) -> str:
    """The judge's prompt for ``candidate`` answering ``problem_prompt``: ``"47+38=" + "84" + "?"``
    (the candidate cut to ``max_chars``; None reads it whole, as a GenRM judging long responses
    must)."""
    return f"{problem_prompt}{clean_candidate(candidate, max_chars)}?"


def judge_target(
    problem: Problem, candidate: str, check: Callable[[str, str], bool] = check_answer
) -> str:
    """What the judge should write: the true answer, ":", then "Yes" if ``check(answer,
    candidate)`` holds, else "No" (EOS is appended by the trainer)."""
    verdict = "Yes" if check(problem.answer, candidate) else "No"
    return f"{problem.answer}:{verdict}"


def parse_verdict(text: str) -> float | None:
    """1.0 for a text ending in "Yes", 0.0 for one ending in "No" (after an optional "...:"
    chain of thought and whitespace), None for anything else, e.g. "", "85:", "85:Maybe"."""
    m = _VERDICT.fullmatch(text.strip())
    if m is None:
        return None
    return 1.0 if m.group(1) == "Yes" else 0.0


class JudgeExample(msgspec.Struct, frozen=True, kw_only=True):
    """One judge training or evaluation pair; ``kind`` says how the candidate was made."""

    prompt: str
    target: str
    correct: bool
    kind: str


def stage_template(prompt: str, response: str, **_: object) -> str:
    """A judge stage's ``template`` for the built-in judge: the question with the policy's
    answer (graphs/grpo_genrm.py writes the same inline, as a graph of your own would)."""
    return judge_prompt(prompt, response)


def stage_parse(verdict: str, **_: object) -> float | None:
    """A judge stage's ``parse`` for the built-in judge's verdicts."""
    return parse_verdict(verdict)


def near_miss(answer: str, rng: random.Random) -> str:
    """A wrong answer that looks plausible: off by 1/10/100, swapped, dropped or doubled digits.

    Returns a string different from ``answer`` (falls back to answer+1 when a edit is a no-op).
    """
    value = int(answer)
    sign, digits = ("-", answer[1:]) if answer.startswith("-") else ("", answer)
    kind = rng.randrange(7)
    if kind == 0:
        out = str(value + rng.choice((-1, 1)))
    elif kind == 1:
        out = str(value + rng.choice((-10, 10)))
    elif kind == 2:
        out = str(value + rng.choice((-100, 100, -2, 2, -11, 11, 9, -9)))
    elif kind == 3 and len(digits) >= 2:
        i = rng.randrange(len(digits) - 1)
        out = sign + digits[:i] + digits[i + 1] + digits[i] + digits[i + 2 :]
    elif kind == 4 and len(digits) >= 2:
        i = rng.randrange(len(digits))
        out = sign + digits[:i] + digits[i + 1 :]
    elif kind == 5:
        i = rng.randrange(len(digits))
        out = sign + digits[:i] + digits[i] + digits[i:]
    else:
        i = rng.randrange(len(digits))
        out = sign + digits[:i] + str(rng.randrange(10)) + digits[i + 1 :]
    return out if out != answer else str(value + 1)


def _garbage(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return ""
    if kind == 1:
        return str(rng.randrange(0, 1000))
    if kind == 2:
        n = rng.randrange(1, MAX_CANDIDATE_CHARS + 4)
        return "".join(rng.choice("0123456789+-=?: ") for _ in range(n))
    n = rng.randrange(1, MAX_CANDIDATE_CHARS + 4)
    return "".join(rng.choice(PRINTABLE) for _ in range(n))


def judge_examples(
    problems: Sequence[Problem],
    seed: int,
    *,
    per_problem: int = 1,
    correct_fraction: float = 0.5,
    garbage_fraction: float = 0.1,
) -> list[JudgeExample]:
    """Judge pairs for ``problems``: about ``correct_fraction`` right answers, ``garbage_fraction``
    empty/garbage candidates, and near misses for the rest. Deterministic in ``seed``."""
    rng = random.Random(seed)
    out = []
    for problem in problems:
        for _ in range(per_problem):
            r = rng.random()
            if r < correct_fraction:
                candidate, kind = problem.answer, "correct"
            elif r < correct_fraction + garbage_fraction:
                candidate, kind = _garbage(rng), "garbage"
            else:
                candidate, kind = near_miss(problem.answer, rng), "near_miss"
            target = judge_target(problem, candidate)
            out.append(
                JudgeExample(
                    prompt=judge_prompt(problem.prompt, candidate),
                    target=target,
                    correct=target.endswith(":Yes"),
                    kind=kind,
                )
            )
    return out
