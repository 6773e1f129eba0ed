"""Responses to one prompt sharing a part of their length (``[response] group_share``): each
response's own distribution stays the same, a step's longest gets shorter as groups grow
alike, and the bounds' longest (``fluid.expected_max``) is what the simulated engine draws."""

from __future__ import annotations

import copy
import math
import random
import statistics
import tomllib
from pathlib import Path

import pytest

from pivotflow.errors import ConfigError
from pivotflow.sim.fluid import expected_max, group_max_tokens
from pivotflow.sim.outputs import response_length
from pivotflow.sim.workload import Lengths, parse_workload

BASE = Path(__file__).parents[2] / "bench/workloads/dense7b_judge7b.toml"


def test_a_share_of_zero_is_the_independent_draw_to_the_bit() -> None:
    alike, independent = Lengths(300, 5.0, 4000, "engine", 0.0), Lengths(300, 5.0, 4000)
    for seed in range(200):
        assert response_length(alike, seed, 4000, group=seed % 7) == response_length(
            independent, seed, 4000)
    assert expected_max(alike, 512, 16) == expected_max(independent, 512)


def test_each_response_keeps_its_own_distribution() -> None:
    """Over many groups, the responses' median and 90th percentile stay the log-normal's
    whatever the share (2000 groups of 4)."""
    for share in (0.0, 0.5, 0.9):
        lengths = Lengths(300, 5.0, 100_000, "engine", share)
        drawn = sorted(response_length(lengths, 10_000 + i, 100_000, group=i // 4)[0]
                       for i in range(8000))
        assert statistics.median(drawn) == pytest.approx(300, rel=0.06)
        p90 = 300 * math.exp(lengths.sigma * 1.2816)
        assert drawn[int(0.9 * len(drawn))] == pytest.approx(p90, rel=0.08)


@pytest.mark.parametrize("share", [0.3, 0.7])
def test_the_bounds_longest_is_the_simulated_engines(share: float) -> None:
    """``expected_max``'s convention (the length the largest of n independent draws is below
    with chance (n/(n+1))^n, about 0.37), kept for correlated groups: over 1500 simulated steps
    of 8 groups of 4, the step's longest response is below it that often."""
    lengths = Lengths(300, 5.0, 100_000, "engine", share)
    x = expected_max(lengths, 32, 4)
    rng = random.Random(share)
    below = 0
    for _ in range(1500):
        keys = [rng.randrange(2**32) for _ in range(8)]
        longest = max(response_length(lengths, rng.randrange(2**31), 100_000, group=k)[0]
                      for k in keys for _ in range(4))
        below += longest <= x
    assert below / 1500 == pytest.approx((32 / 33) ** 32, abs=0.04)


def test_alike_groups_make_a_steps_longest_shorter() -> None:
    """512 responses in groups of 16: the more a group's responses share, the fewer
    independent draws, the shorter the longest; a vanishing share is the independent one."""
    ends = [expected_max(Lengths(1000, 4.0, 10**6, "engine", s), 512, 16)
            for s in (1e-6, 0.3, 0.6, 0.9)]
    independent = expected_max(Lengths(1000, 4.0, 10**6), 512)
    assert ends[0] == pytest.approx(independent, rel=0.01)
    assert ends == sorted(ends, reverse=True) and ends[-1] < 0.8 * independent
    # a group of one shares with nothing
    assert group_max_tokens(Lengths(1000, 4.0, 10**6, "engine", 0.5), 512, 1, (512 / 513) ** 512
                            ) == pytest.approx(independent, rel=0.01)


def test_a_bad_share_names_the_file_and_key() -> None:
    data = tomllib.loads(BASE.read_text())
    for value, says in ((1.0, r"must be in \[0, 1\)"), (-0.1, r"is outside \[0,")):
        bad = copy.deepcopy(data)
        bad["response"]["group_share"] = value
        with pytest.raises(ConfigError, match=rf"w.toml: \[response\] group_share.*{says}"):
            parse_workload(bad, "w.toml")
    bad = copy.deepcopy(data)
    bad["prompt"]["group_share"] = 0.5  # (a prompt is not drawn per response)
    with pytest.raises(ConfigError, match=r"\[prompt\].*group_share"):
        parse_workload(bad, "w.toml")
    good = copy.deepcopy(data)
    good["response"]["group_share"] = 0.5
    assert parse_workload(good, "w.toml").response.group_share == 0.5
