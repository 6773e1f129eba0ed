"""bench/math_reward.py at its smallest: the labelled answers are half of each label, the reward
judges each of them as labelled, and the summary has every key."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

KEYS = {"answers", "workers", "seed", "pivotflow", "algebra_share", "plain_answers_per_s",
        "algebra_answers_per_s"}


@pytest.mark.timeout(180)
def test_the_reward_judges_the_labelled_answers_and_the_summary_has_every_key(
        bench_script: Callable[[str], ModuleType]) -> None:
    bench = bench_script("math_reward")
    pairs = bench.labelled(120, seed=3)
    assert sum(label for *_, label in pairs) == 60
    out = bench.main(["--answers", "120", "--workers", "1", "--seed", "3"])
    assert set(out) >= KEYS
    ours = out["pivotflow"]
    assert ours["accuracy"] == 1.0, ours["misjudged"]
    assert ours["answers_per_s"] > 0 and 0 < out["algebra_share"] < 1
