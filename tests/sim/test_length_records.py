"""The step record's length figures (``response_len_max``, ``response_clip_ratio``), from the
real controller in virtual time: the clip ratio is the share of responses the cap cut."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest
from sim_workloads import tiny

from pivotflow.sim.cluster import Split, simulate
from pivotflow.sim.workload import Lengths


def capped_at(cap: int) -> list[dict[str, object]]:
    wl = tiny(steps=6)
    wl = dataclasses.replace(wl, response=dataclasses.replace(wl.response, cap=cap))
    return simulate(wl, "static", Split(3, 3, 2)).records


@pytest.mark.timeout(120)
def test_the_clip_ratio_is_the_share_the_cap_cut_and_the_longest_is_the_cap() -> None:
    cap = 400
    recs = capped_at(cap)
    sigma = Lengths(200, 10.0, cap, "engine").sigma  # tiny's responses: median 200, p99 10x
    expected = 1 - statistics.NormalDist().cdf(math.log(cap / 200) / sigma)
    ratios = [r["response_clip_ratio"] for r in recs]
    assert all(0.0 <= x <= 1.0 for x in ratios)
    n = sum(r["samples"] for r in recs)
    cut = sum(r["response_clip_ratio"] * r["samples"] for r in recs)
    # 192 responses drawn: within four binomial deviations of the distribution's share
    assert cut / n == pytest.approx(expected, abs=4 * (expected * (1 - expected) / n) ** 0.5)
    for r in recs:  # a step with a cut response has the cap as its longest, and none past it
        assert r["response_len_max"] <= cap
        assert (r["response_len_max"] == cap) == (r["response_clip_ratio"] > 0)
        assert r["response_len_max"] >= r["response_len_mean"]


@pytest.mark.timeout(120)
def test_nothing_is_clipped_under_a_cap_no_response_reaches() -> None:
    recs = capped_at(10**6)
    assert all(r["response_clip_ratio"] == 0.0 for r in recs)
    assert all(r["response_len_max"] < 10**6 for r in recs)
