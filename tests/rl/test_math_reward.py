"""The math reward as a stage function (``rl/math_reward.py``) and its checker processes
(``rl/math_checker.py``): answers scored, algebra in a process of its own, an answer whose
algebra never ends (killed at its time limit, and the next check served), a checker killed
mid-check, garbage on a checker's stdin, the metrics a step gets, and bad arguments."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pivotflow.controller.user_metrics import UserMetrics, recording
from pivotflow.rl.math_checker import MathCheckers
from pivotflow.rl.math_reward import math_reward

pytestmark = pytest.mark.timeout(180)

GSM8K = "Natalia sold 48/2 = 24 clips in May.\nShe sold 48+24 = 72 clips.\n#### 72"
ENDLESS = "\\boxed{9^{9^{9^{9}}}}"  # sympy works the integer out: it would never finish


def scores(reward, pairs: list[tuple[str, str]]) -> list[float]:
    async def run() -> list[float]:
        return [await reward(completion=c, answer=a) for c, a in pairs]
    return asyncio.run(run())


def test_answers_scored_against_references() -> None:
    reward = math_reward(timeout_s=20)
    got = scores(reward, [
        ("So she sold 72 clips.\n#### 72", GSM8K),
        ("#### 71", GSM8K),
        ("Thus $\\boxed{\\dfrac{\\sqrt{2}}{2}}$.", "\\frac{1}{\\sqrt{2}}"),  # algebra
        ("Answer: x = (1, 2)", "(1,2)"),
        ("I think it is 72", GSM8K),  # states no answer in any style
    ])
    assert got == [1.0, 0.0, 1.0, 1.0, 0.0]


def test_dapo_scoring_and_a_missing_answer_of_its_own() -> None:
    reward = math_reward(correct=1.0, wrong=-1.0, no_answer=-2.0, style="boxed")
    assert scores(reward, [("\\boxed{3}", "3"), ("\\boxed{4}", "3"), ("3", "3")]) == \
        [1.0, -1.0, -2.0]
    lenient = math_reward(style="last_number")
    assert scores(lenient, [("it comes to 1,000 apples", "1000")]) == [1.0]


def test_write_correct_gives_the_check_beside_the_reward() -> None:
    reward = math_reward(correct=1.0, wrong=-1.0, write_correct=True)
    assert scores(reward, [("\\boxed{0.5}", "\\frac12"), ("\\boxed{2}", "3"), ("none", "3")]) \
        == [{"reward": 1.0, "correct": True}, {"reward": -1.0, "correct": False},
            {"reward": -1.0, "correct": False}]


def test_endless_algebra_is_killed_at_its_limit_and_the_next_check_is_served() -> None:
    reward = math_reward(timeout_s=2.0)
    metrics = UserMetrics()

    async def run() -> list[tuple[float, float]]:
        out = []
        with recording(metrics):
            for completion, ref in ((ENDLESS, "1"), ("\\boxed{2\\sqrt{3}}", "\\sqrt{12}")):
                start = time.monotonic()
                out.append((await reward(completion=completion, answer=ref),
                            time.monotonic() - start))
        return out

    (endless, waited), (after, _) = asyncio.run(run())
    assert endless == 0.0 and 1.9 < waited < 30
    assert after == 1.0  # a fresh checker, started for it
    means = metrics.drain()
    assert means["math_timeout"] == 0.5 and means["math_algebra"] == 1.0
    assert means["math_correct"] == 0.5 and means["math_no_answer"] == 0.0


def test_a_checker_killed_mid_check_scores_that_answer_wrong_and_recovers() -> None:
    checkers = MathCheckers(workers=1, timeout_s=60)

    async def run() -> list[tuple[bool | None, str]]:
        first = await checkers.check("x^2+2x+1", "(x+1)^2")  # starts the process
        [pid] = checkers.pids()
        endless = asyncio.ensure_future(checkers.check("9^{9^{9^{9}}}", "1"))
        await asyncio.sleep(1.0)
        os.kill(pid, signal.SIGKILL)
        return [first, await endless, await checkers.check("\\sqrt{4}", "2")]

    assert asyncio.run(run()) == [(True, "algebra"), (None, "error"), (True, "algebra")]


def test_checker_processes_end_with_their_loop() -> None:
    checkers = MathCheckers(workers=2, timeout_s=30)

    async def run() -> list[int]:
        await asyncio.gather(checkers.check("\\sqrt{4}", "2"), checkers.check("\\pi", "3"))
        return checkers.pids()

    pids = asyncio.run(run())
    assert len(pids) == 2
    for pid in pids:  # killed and reaped when asyncio.run closed the loop
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_checker_process_answers_garbage_with_one_line_and_goes_on() -> None:
    lines = b'not json\n{"pred": 1}\n{"pred": "\\\\sqrt{4}", "gold": "2"}\n'
    out = subprocess.run([sys.executable, "-m", "pivotflow.rl.math_checker", "2048"],
                         input=lines, capture_output=True, timeout=120, check=True)
    ready, *answers = out.stdout.decode().splitlines()
    assert ready == "ready"
    assert [json.loads(a) for a in answers] == [
        {"equal": None, "error": "a request is {pred: str, gold: str}"},
        {"equal": None, "error": "a request is {pred: str, gold: str}"},
        {"equal": True}]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"style": "latex"}, "style must be one of auto, boxed, gsm8k, answer, last_number"),
    ({"answer": "the answer"}, "answer must name a field"),
    ({"correct": "1"}, "correct must be a number"),
    ({"workers": 0}, "workers must be a whole number >= 1"),
    ({"timeout_s": 0}, "timeout_s must be > 0"),
])
def test_bad_arguments_are_one_line(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        math_reward(**kwargs)
    assert "\n" not in str(err.value)


def test_an_empty_reference_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match="the sample's 'answer' field is empty"):
        scores(math_reward(), [("\\boxed{1}", None)])  # type: ignore[list-item]


def test_a_checker_busy_on_endless_algebra_exits_when_its_parent_dies() -> None:
    parent = ("import os, subprocess, sys, time\n"
              "p = subprocess.Popen([sys.executable, '-m', 'pivotflow.rl.math_checker',\n"
              "                      '2048', str(os.getpid())],\n"
              "                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n"
              "assert p.stdout.readline() == b'ready\\n'\n"
              "p.stdin.write(b'{\"pred\": \"9^{9^{9^{9}}}\", \"gold\": \"1\"}\\n')\n"
              "p.stdin.flush()\n"
              "print(p.pid, flush=True)\n"
              "time.sleep(0.5)\n")  # then exits, leaving its child mid-check
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, timeout=120,
                         check=True)
    pid = int(out.stdout)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    pytest.fail("the checker outlived its parent by 10 s")
