"""The joint bound: the non-clairvoyant bound with its two limits paid on the same GPUs.

The non-clairvoyant bound (``fluid.fluid_bound``) is the smaller of two limits, each reached on
its own: the *work* limit has every GPU busy at its role's full batch; the *critical path*
decodes each step's longest response beside every response still unfinished, spread over every
policy replica of the cluster (any unfinished one may be the longest). A schedule pays both at
once. The replicas that hold a step's tail either run it at the tail's small batch, and the
slots they leave empty are GPU time the work limit counted as used, or they fill those slots
with other sequences, and every decode step of the tail gets slower. This bound charges that
choice, decode iteration by decode iteration, and takes the best mix.

Iteration ``k`` of a step's generation (``A_k`` responses unfinished, as in
``fluid._unfinished_decode_s``) holds the tail on ``m`` replicas, ``a = A_k / m`` a replica
(``1 <= m <= R``: every policy replica of the cluster; ``a >= 1``), plus ``f`` other sequences
(``a + f <= B``, the full batch the work limit assumes). Then

* its time is the replica's decode step ``T = base(b) + per_seq b + per_ctx (a (P + k) + f P)``
  at ``b = a + f`` (``P``: the prompt; a filler's context is taken as short as a prompt, which
  only lowers ``T``);
* its *excess* is the replica-seconds beyond what the tokens it decodes cost at the full batch:
  ``E = m (base(b) - b base(B) / B)`` (the per-sequence and per-context terms are the same per
  token at any batch: only the step's fixed part, the weights read, is wasted on empty slots).

With no fillers (``f = 0``, ``m = R``) this is the non-clairvoyant decode and ``E`` is largest;
with full fillers ``E = 0`` and ``T`` is a full batch's step. A schedule's step then needs
``D = sum T`` of decode on its critical path and ``sum E`` replica-seconds of work beyond the
work limit's, so its throughput is at most ``min(work(E), path(D))``, where ``work(E)`` is the
data-parallel work bound with ``E / n`` worker-seconds added to each sample's generation, and
``path(D) = n (max_staleness + 1) / (C + D)`` (``C``: the prompt's prefill, the longest
response's judging and the step's training on the whole cluster, as in the critical path).

The bound is the largest ``min(work(E), path(D))`` over every ``(D, E)`` that satisfies
``D + mu E >= Lambda(mu)`` for each multiplier ``mu`` of a sweep, where ``Lambda(mu)`` is a lower
bound of ``sum_k min_choice (T_k + mu E_k)``: every schedule's ``(D, E)`` satisfies these, so
the largest over the region they bound is an upper bound (a relaxation; more multipliers only
tighten it). Per iteration the minimum over ``f`` is at ``f = 0`` or a full batch (it is linear
in ``f``); over ``a`` it is bounded below on a geometric grid, interval by interval (``base``
and ``per_seq b`` grow with ``b``, ``m = A / a`` falls), so no grid point can overstate it.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from pivotflow.sim.cost_model import CostModel
from pivotflow.sim.fluid import (
    RoleRates,
    concurrent_devices,
    data_parallel_work_bound,
    drift_steps,
    fluid_bound,
    length_grid,
    nonclairvoyant_partial_end,
    policy_replicas,
    role_rates,
    rollout_full_batch,
)
from pivotflow.sim.workload import Workload

# Multipliers (seconds of critical path per replica-second of excess): 0, then geometric over
# the range where a step's excess (up to every replica's fixed part, ~1 s an iteration) trades
# against its time (~10 ms an iteration).
MULTIPLIERS = (0.0, *np.geomspace(1e-7, 1e3, 121).tolist())
GRID = 96  # batch points per iteration between the tail spread thinnest and packed densest


def tail_frontier(wl: Workload, alive: float, tokens: float) -> list[tuple[float, float]]:
    """``(mu, Lambda(mu))`` for a step whose ``alive`` responses start together and whose last
    ends after ``tokens`` decode iterations: a lower bound on ``D + mu E`` of any schedule."""
    cost = CostModel(wl)
    pol = wl.policy
    replicas = policy_replicas(wl, cost)
    prompt = cost.mean_prompt() + 1  # BOS
    full = full_batch(wl)
    k_full = cost.decode(pol, full)
    per_token_base = k_full.base / full  # the fixed part a token pays at the full batch
    r = wl.response
    nd = NormalDist()
    steps = np.arange(math.ceil(tokens), dtype=float)
    if r.sigma == 0:
        share = np.where(steps < r.median, 1.0, 0.0)
    else:
        z = np.log(np.maximum(steps, 1e-12) / r.median) / r.sigma
        share = 1 - np.vectorize(nd.cdf)(z)
        share[0] = 1.0
    tail = np.maximum(alive * share, 1.0)  # A_k (the longest is still there)
    ctx = prompt + steps
    # The filled choice: the tail spread thinnest among full batches (no excess).
    thin = np.maximum(tail / replicas, 1.0)
    filled = np.where(  # (only where the tail leaves room for fillers)
        thin < full,
        k_full.base + k_full.per_seq * full + k_full.per_ctx * (full * prompt + thin * steps),
        np.inf)
    # The unfilled choice: a geometric grid of batches a in [thin, min(A, full)].
    hi = np.maximum(np.minimum(tail, full), thin)
    frac = np.linspace(0.0, 1.0, GRID)
    a = thin[:, None] * (hi / thin)[:, None] ** frac[None, :]
    a_lo, a_hi = a[:, :-1], a[:, 1:]  # each interval's ends
    base_lo = _base(cost, a_lo)
    # On [a_lo, a_hi]: T >= base(a_lo) + (per_seq + per_ctx ctx) a_lo,
    #                  E = A (base(a) / a - base_B / B) >= A (base(a_lo) / a_hi - base_B / B)
    t_lo = base_lo + (k_full.per_seq + k_full.per_ctx * ctx[:, None]) * a_lo
    e_lo = np.maximum(tail[:, None] * (base_lo / a_hi - per_token_base), 0.0)
    # (one-point intervals where thin == hi: the point itself)
    out = []
    for mu in MULTIPLIERS:
        unfilled = np.min(t_lo + mu * e_lo, axis=1)
        out.append((mu, float(np.sum(np.minimum(filled, unfilled)))))
    return out


def _base(cost: CostModel, b: np.ndarray) -> np.ndarray:
    """A lower bound of a replica's fixed decode part at each batch of ``b``: exact for a dense
    model (one figure); an MoE's grows with the batch (more experts read), so it is read off a
    fine table at the table's batch at or below each (a fixed part never falls with the batch).
    """
    m = cost.wl.policy
    if not m.moe:
        return np.full_like(b, cost.decode(m, 1).base)
    table = np.geomspace(1.0, float(b.max()) + 1.0, 4096)
    bases = np.array([cost.decode(m, float(x)).base for x in table])
    at = np.clip(np.searchsorted(table, b, side="right") - 1, 0, len(table) - 1)
    return bases[at]


def full_batch(wl: Workload) -> int:
    """The full batch the work limit runs a rollout replica at (as ``fluid.role_rates``)."""
    resp = length_grid(wl.response)
    return rollout_full_batch(CostModel(wl), sum(resp) / len(resp))


def _work(wl: Workload, r: RoleRates, excess_worker_s: float) -> float:
    """The data-parallel work bound with ``excess_worker_s`` more per sample of generation."""
    g = wl.group_gpus
    work_gpu_s = g / r.rollout + g / r.genrm + g / r.trainer + g * excess_worker_s
    return min(concurrent_devices(wl) / work_gpu_s,
               data_parallel_work_bound(wl, r, excess_worker_s))


def best_of_region(wl: Workload, frontier: list[tuple[float, float]]) -> dict[str, float]:
    """The largest ``min(work(E), path(D))`` over the region ``D + mu E >= Lambda(mu)``, with
    the ``(D, E)`` it is reached at."""
    r = role_rates(wl)
    n = wl.samples_per_step
    rpw = CostModel(wl).replicas(wl.policy, wl.group_gpus)
    other = r.critical_path_s - r.decode_s  # prefill, judging the longest, the step's train
    d_min = frontier[0][1]  # mu = 0: the shortest decode any schedule has

    def least_excess(d: float) -> float:  # the region's lowest E at decode time d
        return max([0.0] + [(lam - d) / mu for mu, lam in frontier if mu > 0])

    def work(d: float) -> float:
        return _work(wl, r, least_excess(d) / rpw / n)

    def path(d: float) -> float:
        return n * (wl.max_staleness + 1) / (other + d)

    lo, hi = d_min, d_min
    while work(hi) < path(hi) and least_excess(hi) > 0:  # widen until work no longer binds
        hi = hi * 2 + 1e-9
    if work(lo) >= path(lo):
        d = lo
    else:
        for _ in range(100):  # work(d) - path(d) rises with d: its root is the best point
            mid = (lo + hi) / 2
            if work(mid) < path(mid):
                lo = mid
            else:
                hi = mid
        d = hi
    best = min(work(d), path(d))
    return {"joint_samples_per_s": best, "joint_decode_s": d,
            "joint_excess_worker_s_per_step": least_excess(d) / rpw}


def joint_bound(wl: Workload, over_sample: float = 0.0) -> dict[str, float]:
    """The joint bound (samples/s) and the decode time and excess it is reached at; with
    ``over_sample`` > 0, for partial rollouts that admit that many more groups (the step ends
    at the group-max quantile ``fluid.nonclairvoyant_partial_end`` gives, the best share of
    the over-sampling taken). A drifting workload's is each step's, combined as
    ``fluid_bound`` combines its (samples over the sum of the steps' times)."""
    if wl.schedule is not None:
        seen: dict[str, dict[str, float]] = {}  # (the steps after the last point are alike)
        per = []
        for k in drift_steps(wl):
            at = wl.at(k)
            key = repr(at)
            if key not in seen:
                seen[key] = joint_bound(at, over_sample)
            per.append(seen[key])
        rate = len(per) / sum(1 / b["joint_samples_per_s"] for b in per)
        return {"joint_samples_per_s": rate,
                "joint_decode_s": sum(b["joint_decode_s"] for b in per) / len(per),
                "joint_excess_worker_s_per_step": sum(
                    b["joint_excess_worker_s_per_step"] for b in per) / len(per)}
    best: dict[str, float] | None = None
    for alive, tokens in nonclairvoyant_partial_end(wl, over_sample):
        got = best_of_region(wl, tail_frontier(wl, alive, tokens))
        if best is None or got["joint_samples_per_s"] > best["joint_samples_per_s"]:
            best = got
    assert best is not None
    return best


def bounds(wl: Workload) -> dict[str, float]:
    """``fluid.fluid_bound``'s keys and ``joint_bound``'s: every bound a report puts a run
    beside."""
    return {**fluid_bound(wl), **joint_bound(wl)}
