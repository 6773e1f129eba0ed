"""The joint bound (``pivotflow/sim/joint_bound.py``): the non-clairvoyant bound's two limits
paid on the same GPUs. It must never exceed the non-clairvoyant bound, its per-iteration lower
bounds must sit under (and near) a brute-force minimum, and no simulated run may beat it."""

from __future__ import annotations

import dataclasses
import glob
import json
import math
from pathlib import Path

import numpy as np
import pytest

from pivotflow.sim.cluster import Split, simulate
from pivotflow.sim.cost_model import CostModel
from pivotflow.sim.fluid import (
    expected_max,
    fluid_bound,
    nonclairvoyant_decode_s,
    policy_replicas,
    rank_splits,
)
from pivotflow.sim.joint_bound import MULTIPLIERS, full_batch, joint_bound, tail_frontier
from pivotflow.sim.workload import Lengths, Workload, load_workload

ROOT = Path(__file__).parents[2]
SHIPPED = sorted(glob.glob(str(ROOT / "bench/workloads/*.toml"))
                 + glob.glob(str(ROOT / "bench/workloads/drift/*.toml")))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: Path(p).stem)
def test_the_joint_bound_is_never_above_the_nonclairvoyant_bound(path: str) -> None:
    wl = load_workload(path)
    if wl.schedule is not None:
        wl = wl.at(wl.steps)  # (one step: the drifting runs' steps are each such a workload)
    nc = fluid_bound(wl)["nonclairvoyant_samples_per_s"]
    got = joint_bound(wl)
    assert 0 < got["joint_samples_per_s"] <= nc * (1 + 1e-9)
    assert got["joint_decode_s"] > 0 and got["joint_excess_worker_s_per_step"] >= 0


def test_where_both_limits_are_close_paying_both_lowers_the_bound() -> None:
    """dense7b+32b at 128 GPUs: the work limit 153.8, the blind critical path 170 samples/s; a
    tail spread thin wastes the replicas' weight reads, a filled one decodes ~2x slower."""
    wl = load_workload(ROOT / "bench/workloads/dense7b_judge32b.toml")
    f = fluid_bound(wl)
    got = joint_bound(wl)["joint_samples_per_s"]
    assert got < 0.9 * f["nonclairvoyant_samples_per_s"]


def test_with_no_excess_charged_the_tail_decodes_as_the_nonclairvoyant_bound_says() -> None:
    """At multiplier 0 the best choice is the tail spread over every replica, unfilled: the
    non-clairvoyant decode, term for term."""
    wl = load_workload(ROOT / "bench/workloads/dense7b_judge7b.toml")
    n = wl.samples_per_step
    frontier = tail_frontier(wl, n, expected_max(wl.response, n))
    assert frontier[0][0] == 0.0
    assert frontier[0][1] == pytest.approx(nonclairvoyant_decode_s(wl), rel=1e-9)
    lams = [lam for _, lam in frontier]
    assert lams == sorted(lams)  # D + mu E grows with mu (E >= 0)


def brute_force(wl: Workload, mu: float) -> float:
    """sum_k min over (m, f) of T + mu E on a fine grid of m (every whole number of replicas
    from 1 to the most the tail spreads over) and each f from none to a full batch: what
    ``tail_frontier`` bounds from below, computed the plain way."""
    cost = CostModel(wl)
    pol = wl.policy
    replicas = policy_replicas(wl, cost)
    prompt = cost.mean_prompt() + 1
    full = full_batch(wl)
    kb = cost.decode(pol, full)
    n = wl.samples_per_step
    r = wl.response
    total = 0.0
    for k in range(math.ceil(expected_max(r, n))):
        share = 1.0 if k == 0 else 1 - 0.5 * (1 + math.erf(math.log(k / r.median)
                                                            / r.sigma / math.sqrt(2)))
        alive = max(n * share, 1.0)
        best = math.inf
        for m in range(1, min(replicas, math.floor(alive)) + 1):
            a = alive / m
            if a > full:
                continue
            for f in np.linspace(0.0, full - a, 9):
                b = a + f
                kk = cost.decode(pol, b)
                t = kk.base + kk.per_seq * b + kk.per_ctx * (a * (prompt + k) + f * prompt)
                e = m * (kk.base - b * kb.base / full)
                best = min(best, t + mu * e)
        total += best
    return total


@pytest.mark.parametrize("mu", [0.0, 1e-3, 3e-2, 1.0])
def test_the_per_iteration_bounds_sit_under_and_near_a_brute_force_minimum(
    tiny_workload: Workload, mu: float
) -> None:
    wl = dataclasses.replace(tiny_workload, response=Lengths(60, 10.0, 400))
    n = wl.samples_per_step
    frontier = dict(tail_frontier(wl, n, expected_max(wl.response, n)))
    near = min(MULTIPLIERS, key=lambda x: abs(x - mu))
    exact = brute_force(wl, near)
    assert frontier[near] <= exact * (1 + 1e-9)
    assert frontier[near] >= 0.9 * exact


def test_no_simulated_run_beats_the_joint_bound(tiny_workload: Workload) -> None:
    # 12 steps: the bound is in expectation (of the longest response); a few steps vary
    bound = joint_bound(tiny_workload)["joint_samples_per_s"]
    split = Split(**rank_splits(tiny_workload, 1)[0][1])
    for planner in ("backpressure", "static"):
        r = simulate(tiny_workload, planner, split, steps=12)
        assert r.samples_per_s <= bound * 1.05


@pytest.mark.parametrize(
    "name", ["sim_drift.json", "sim_drift_512.json", "sim_drift_1024.json", "sim_paper.json"])
def test_the_stored_128_to_1024_gpu_simulations_all_sit_under_the_joint_bound(name: str) -> None:
    """Every planner's rate in the stored results (the simulator at 128-1024 GPUs) is under
    the joint bound of its group: had any beaten it, the bound would be wrong."""
    for g in json.loads((ROOT / "bench/results" / name).read_text())["results"]:
        frac = g["fraction_of_joint"]
        assert frac and all(v is None or 0 < v <= 1.0 for v in frac.values()), g["workload"]
        nc = g["fraction_of_nonclairvoyant"]
        assert all(frac[k] >= nc[k] for k in frac if frac[k] is not None)
