"""How right and how fast the math reward is: labelled answers scored by ``math_reward``, and by
math-verify (what TRL's ``accuracy_reward`` and OpenRLHF's and verl's math recipes call) where
it is installed, in one sitting.

The answers are generated with their labels: for each of ``--answers`` reference answers
(integers, money, fractions and negative ones, decimals, percentages, radicals, multiples of
pi, points, intervals, sets of roots, polynomials, lines, multiple-choice letters,
inequalities, matrices) a response that states it in another spelling (label 1)
or states a near miss (label 0: the next integer, a reciprocal, an interval's bracket turned,
a point's coordinates swapped, ...), each as a model writes it (a ``\\boxed{}`` at the end of a
sentence, GSM8K's ``####``, ``Answer:``). Half the pairs are each label.

Reported: each checker's ``accuracy`` against the labels, ``false_positives`` (a wrong answer
rewarded) and ``false_negatives``; ``answers_per_s`` for ``math_reward`` with ``--workers``
checker processes (all answers at once, as a step's reward stage calls it) and for math-verify
(in this process, one at a time, its own per-call timeout), their ratio, and the share of
answers that needed algebra (``algebra_share``), with the rates of the answers decided without
algebra alone (``plain_answers_per_s``: the bound on the mix) and of those that needed it
(``algebra_answers_per_s``). The last line printed is one JSON object.

The labels are this file's own: the corpus holds the forms its author knew to write, so an
accuracy of 1.0 here says the reward reads those, not that it reads every dataset's answers.
math-verify's misses here are GSM8K's ``####`` form, which it does not look for.

    python bench/math_reward.py [--answers 400] [--workers 2] [--seed 0]

math-verify is not a dependency: ``pip install 'math-verify[antlr4_13_2]'`` to compare with it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import random
import sys
import time
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from pivotflow.controller.user_metrics import UserMetrics, recording
from pivotflow.rl.math_reward import math_reward

Pair = tuple[str, str, int]  # response, reference, label (1: the same answer)


def _frac(f: Fraction) -> str:
    sign = "-" if f < 0 else ""
    return f"{sign}\\frac{{{abs(f.numerator)}}}{{{f.denominator}}}"


def _integer(r: random.Random) -> tuple[str, list[str], list[str]]:
    n = r.randint(2, 99999)
    same = [str(n), f"{n:,}", f"{n}.0", f"\\${n}", f"{n}\\text{{ dollars}}",
            f"\\dfrac{{{2 * n}}}{{2}}"]
    return str(n), same, [str(n + 1), str(-n), f"{n}.5"]


def _fraction(r: random.Random) -> tuple[str, list[str], list[str]]:
    a, b = r.randint(1, 40), r.choice([2, 3, 4, 5, 6, 7, 8, 9, 12, 16])
    f = Fraction(a, b) if Fraction(a, b).denominator > 1 else Fraction(a, b + 1)
    same = [_frac(f), f"{f.numerator}/{f.denominator}", _frac(f).replace("\\frac", "\\dfrac")]
    if 10**6 % f.denominator == 0:
        same.append(str(float(f)))
    else:
        same.append(f"{float(f):.9f}")
    wrong = [_frac(1 / f), _frac(f + 1)]
    if round(f, 2) != f:  # a decimal cut short (where two places are not exact)
        wrong.append(f"{float(f):.2f}")
    return _frac(f), same, wrong


def _percent(r: random.Random) -> tuple[str, list[str], list[str]]:
    p = r.randint(1, 99)
    return f"{p}\\%", [f"{p}\\%", f"{p}", f"{p}%", f"{p / 100}"], [f"{p + 1}\\%", f"{p / 10}"]


def _radical(r: random.Random) -> tuple[str, list[str], list[str]]:
    k, m = r.randint(2, 9), r.choice([2, 3, 5, 6, 7])
    gold = f"{k}\\sqrt{{{m}}}"
    same = [gold, f"\\sqrt{{{k * k * m}}}", f"{k}\\sqrt {m}", f"\\frac{{{2 * k}\\sqrt{{{m}}}}}{{2}}",
            f"{k * m}/\\sqrt{{{m}}}"]
    return gold, same, [f"{k}\\sqrt{{{m + 1}}}", f"{k + 1}\\sqrt{{{m}}}", f"\\sqrt{{{k * m}}}"]


def _pi(r: random.Random) -> tuple[str, list[str], list[str]]:
    b = r.choice([2, 3, 4, 6])
    f = Fraction(r.choice([a for a in range(1, 8) if a % b]), b)
    gold = f"\\frac{{{f.numerator}\\pi}}{{{f.denominator}}}"
    same = [gold, f"\\frac{{{f.numerator}}}{{{f.denominator}}}\\pi",
            f"{f.numerator}\\pi/{f.denominator}"]
    return gold, same, [f"\\frac{{{f.denominator}\\pi}}{{{f.numerator + f.denominator}}}",
                        f"{f.numerator}\\pi"]


def _point(r: random.Random) -> tuple[str, list[str], list[str]]:
    x, y = r.randint(-9, 9), r.randint(-9, 9)
    y = y if y != x else x + 1
    return (f"({x},{y})", [f"({x}, {y})", f"\\left({x},{y}\\right)", f"({x}.0, {y})"],
            [f"({y},{x})", f"({x},{y + 1})"])


def _interval(r: random.Random) -> tuple[str, list[str], list[str]]:
    a, b = sorted(r.sample(range(-9, 10), 2))
    return (f"[{a},{b})", [f"[{a}, {b})", f"\\left[{a},{b}\\right)"],
            [f"({a},{b})", f"[{a},{b}]", f"[{a},{b + 1})"])


def _roots(r: random.Random) -> tuple[str, list[str], list[str]]:
    a, b = r.sample(range(-9, 10), 2)
    return (f"{a}, {b}", [f"{a}, {b}", f"{b}, {a}", f"{b},{a}"],
            [f"{a}", f"{a}, {b + 20}"])


def _polynomial(r: random.Random) -> tuple[str, list[str], list[str]]:
    a = r.randint(1, 9)
    return (f"(x+{a})^2", [f"x^2+{2 * a}x+{a * a}", f"(x+{a})^{{2}}", f"(x + {a})(x + {a})"],
            [f"x^2+{a * a}", f"x^2+{a}x+{a * a}"])


def _choice(r: random.Random) -> tuple[str, list[str], list[str]]:
    letter = r.choice("ABCDE")
    other = r.choice([c for c in "ABCDE" if c != letter])
    return (letter, [letter, f"({letter})", f"\\text{{({letter})}}", letter.lower()],
            [other, f"({other})"])


def _line(r: random.Random) -> tuple[str, list[str], list[str]]:
    m, c = r.sample(range(2, 10), 2)  # (different: swapped they would be the same line)
    return (f"y={m}x+{c}", [f"y = {c} + {m}x", f"y={m}x+{c}", f"{m}x+{c}"],
            [f"y={m}x-{c}", f"y={c}x+{m}"])


def _negative_fraction(r: random.Random) -> tuple[str, list[str], list[str]]:
    a, b = r.choice([(1, 2), (3, 4), (2, 3), (5, 6), (7, 8)])
    return (f"-\\frac{{{a}}}{{{b}}}", [f"\\frac{{-{a}}}{{{b}}}", f"-{a}/{b}", f"\\frac{{{a}}}{{-{b}}}"],
            [f"\\frac{{{a}}}{{{b}}}", f"-\\frac{{{b}}}{{{a}}}"])


def _inequality(r: random.Random) -> tuple[str, list[str], list[str]]:
    a = r.randint(-9, 9)
    return (f"x > {a}", [f"x>{a}", f"{a} < x", f"x \\gt {a}"],
            [f"x \\ge {a}", f"x < {a}", f"x > {a + 1}"])


def _matrix(r: random.Random) -> tuple[str, list[str], list[str]]:
    a, b, c, d = r.sample(range(1, 20), 4)  # (distinct: the transpose is another matrix)
    m = "\\begin{{{k}}} {a} & {b} \\\\ {c} & {d} \\end{{{k}}}"
    gold = m.format(k="pmatrix", a=a, b=b, c=c, d=d)
    return (gold, [m.format(k="bmatrix", a=a, b=b, c=c, d=d),
                   m.format(k="pmatrix", a=f"\\frac{{{2 * a}}}{{2}}", b=b, c=c, d=d)],
            [m.format(k="pmatrix", a=a, b=c, c=b, d=d), m.format(k="pmatrix", a=a, b=b, c=c,
                                                                 d=d + 1)])


KINDS: list[Callable[[random.Random], tuple[str, list[str], list[str]]]] = [
    _integer, _integer, _fraction, _percent, _radical, _pi, _point, _interval, _roots, _polynomial,
    _choice, _line, _negative_fraction, _inequality, _matrix]
WRAPS = ["So the answer is $\\boxed{{{}}}$.", "Putting it together, \\boxed{{{}}}",
         "We find that the answer is $\\boxed{{{}}}$"]


def labelled(n: int, seed: int) -> list[Pair]:
    """``n`` (response, reference, label) pairs, half of each label."""
    r = random.Random(seed)
    pairs: list[Pair] = []
    while len(pairs) < n:
        gold, same, wrong = r.choice(KINDS)(r)
        label = len(pairs) % 2
        answer = r.choice(same if label else wrong)
        wrap = "#### {}" if gold.lstrip("-").isdigit() and r.random() < 0.5 else r.choice(WRAPS)
        pairs.append((wrap.format(answer), gold, label))
    return pairs


def ours(pairs: list[Pair], workers: int) -> tuple[list[float], float, float]:
    """Each pair's reward from ``math_reward`` (all at once), the seconds it took and the share
    decided by algebra; the checker processes started before the clock."""
    reward = math_reward("answer", workers=workers, timeout_s=10.0)
    metrics = UserMetrics()

    async def run() -> tuple[list[float], float]:
        await asyncio.gather(*(reward(completion="\\boxed{x^2}", answer="x^2+0")
                               for _ in range(workers)))  # start each checker
        with recording(metrics):
            metrics.drain()
            start = time.perf_counter()
            got = await asyncio.gather(*(reward(completion=c, answer=g) for c, g, _ in pairs))
            return list(got), time.perf_counter() - start

    got, seconds = asyncio.run(run())
    return got, seconds, metrics.drain().get("math_algebra", 0.0)


def theirs(pairs: list[Pair]) -> tuple[list[float], float] | None:
    """Each pair scored by math-verify as TRL's ``accuracy_reward`` calls it (the reference
    parsed as LaTeX in ``$...$``, the response with its default extraction), one at a time."""
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    start = time.perf_counter()
    got = []
    for response, gold, _ in pairs:
        try:
            got.append(float(verify(parse(f"${gold}$"), parse(response))))
        except Exception:  # (math-verify raises on some inputs; a failure scores 0)
            got.append(0.0)
    return got, time.perf_counter() - start


def graded(got: list[float], pairs: list[Pair]) -> dict[str, Any]:
    wrong = [(p, g) for p, g in zip(pairs, got, strict=True) if (g > 0) != bool(p[2])]
    return {"accuracy": round(1 - len(wrong) / len(pairs), 4),
            "false_positives": sum(1 for p, _ in wrong if not p[2]),
            "false_negatives": sum(1 for p, _ in wrong if p[2]),
            "misjudged": [{"response": p[0], "reference": p[1], "label": p[2]}
                          for p, _ in wrong[:8]]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--answers", type=int, default=400)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    pairs = labelled(args.answers, args.seed)
    got, seconds, algebra_share = ours(pairs, args.workers)
    out: dict[str, Any] = {
        "bench": "math_reward", "when": datetime.datetime.now().isoformat(timespec="seconds"),
        "answers": len(pairs), "workers": args.workers, "seed": args.seed,
        "pivotflow": {**graded(got, pairs), "answers_per_s": round(len(pairs) / seconds, 1)},
        "algebra_share": round(algebra_share, 3),
    }
    # each kind alone: the answers decided without algebra (on the controller's loop: the
    # bound on the mix) and those that needed it (what the checker processes do a second)
    for kind, part in (("plain", [p for p in pairs if _plain(p)]),
                       ("algebra", [p for p in pairs if not _plain(p)])):
        if part:
            _, part_s, _ = ours(part, args.workers)
            out[f"{kind}_answers_per_s"] = round(len(part) / part_s, 1)
    other = theirs(pairs)
    if other is None:
        print("math-verify is not installed: pip install 'math-verify[antlr4_13_2]' to compare",
              file=sys.stderr)
    else:
        theirs_got, theirs_s = other
        out["math_verify"] = {**graded(theirs_got, pairs),
                              "answers_per_s": round(len(pairs) / theirs_s, 1)}
        out["pivotflow_over_math_verify"] = round(theirs_s / seconds, 2)
        out["agreement_with_math_verify"] = round(sum(
            (a > 0) == (b > 0) for a, b in zip(got, theirs_got, strict=True)) / len(pairs), 4)
    print(json.dumps(out))
    return out


def _plain(pair: Pair) -> bool:
    """Whether the pair is decided without algebra (as the reward decides it)."""
    from pivotflow.rl.math_answer import equivalent, final_answer, normalized, reference_answer

    stated = final_answer(pair[0])
    if stated is None:
        return True
    return equivalent(normalized(stated), normalized(reference_answer(pair[1]))) is not None


if __name__ == "__main__":
    main()
