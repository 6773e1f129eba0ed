"""The fluid bound, and per-role service rates for ranking static splits.

Fluid bound: the throughput a perfect scheduler could reach, as the smaller of
* work: GPUs / (GPU-seconds one sample needs in rollout + judging + training), each role at
  its best batch (the memory-limited batch its engine holds), and
* critical path: each step's longest sequence must be decoded (alone, at batch 1, on its TP
  group), judged, and trained on before the step after next may start, so at most
  ``samples_per_step * (max_staleness + 1)`` samples finish per critical path.

The fluid bound's critical path needs a scheduler that knows which sequence is the longest
before it ends. The non-clairvoyant bound takes that away and nothing else: a response's
length is known only at its end, so while ``S`` sequences of a step are unfinished each of
them may be the longest, and the longest decodes no faster than at the batch of ``S`` spread
evenly over every policy replica of the cluster (the cluster doing nothing else meanwhile).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from statistics import NormalDist

from pivotflow.sim.cost_model import CostModel
from pivotflow.sim.workload import Lengths, Workload

_GRID = 2000  # quantile points for expectations over a length distribution


def length_grid(lengths: Lengths) -> list[float]:
    """Equally likely lengths (mid-quantiles) of a capped log-normal."""
    nd = NormalDist()
    return [
        min(lengths.cap, lengths.median * math.exp(lengths.sigma * nd.inv_cdf((i + 0.5) / _GRID)))
        for i in range(_GRID)
    ]


def expected_max(lengths: Lengths, n: int, group_size: int = 1) -> float:
    """Expected largest of ``n`` draws (the ``n/(n+1)`` quantile), capped. With
    ``lengths.group_share`` the draws come in groups of ``group_size`` that share a part of
    their log-length: the length at which the largest of them is as likely below as ``n``
    independent draws' ``n/(n+1)`` quantile is (fewer independent draws: a shorter longest)."""
    q = n / (n + 1)
    if not lengths.group_share or group_size <= 1:
        return min(lengths.cap, lengths.median * math.exp(lengths.sigma * NormalDist().inv_cdf(q)))
    return group_max_tokens(lengths, n / group_size, group_size, q**n)


def group_max_tokens(lengths: Lengths, groups: float, group_size: int, target: float) -> float:
    """The length ``x`` (capped) with P(the largest of ``groups`` groups of ``group_size``
    correlated draws <= x) = ``target``: a group shares ``sqrt(share) z_g`` of its standard
    normal log-length, so P(its max <= t) = E_zg[Phi((t - sqrt(share) z_g) /
    sqrt(1 - share))^group_size], taken on a grid of ``z_g``, and ``t`` found by bisection."""
    nd = NormalDist()
    a, b = math.sqrt(lengths.group_share), math.sqrt(1 - lengths.group_share)
    zs = [nd.inv_cdf((i + 0.5) / 400) for i in range(400)]  # equally likely z_g

    def cdf(t: float) -> float:
        group = sum(nd.cdf((t - a * z) / b) ** group_size for z in zs) / len(zs)
        return group**groups

    lo, hi = -10.0, 10.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < target else (lo, mid)
    return min(lengths.cap, lengths.median * math.exp(lengths.sigma * (lo + hi) / 2))


@dataclass(frozen=True, slots=True)
class RoleRates:
    """Samples/s one worker (one GPU group) completes in each role, at its full batch."""

    rollout: float
    genrm: float
    trainer: float
    critical_path_s: float
    decode_s: float = 0.0  # the longest sequence's decode at batch 1 (in ``critical_path_s``)
    # (trainers, seconds of one step) where data parallel is measured (a CPU machine)
    dp_step_s: tuple[tuple[int, float], ...] = ()

    def as_dict(self) -> dict[str, float]:
        return {"rollout": self.rollout, "genrm": self.genrm, "trainer": self.trainer}


def role_rates(wl: Workload) -> RoleRates:
    """Per-worker service rates and the critical path of one step, from the cost model."""
    cost = CostModel(wl)
    g = wl.group_gpus
    resp = length_grid(wl.response)
    e_len = sum(resp) / len(resp)
    e_len2 = sum(x * x for x in resp) / len(resp)
    prompt = cost.mean_prompt() + 1  # BOS
    pol, jud = wl.policy, wl.judge
    # Rollout: a token is generated at a context of prompt + (length-biased) half the response.
    b = rollout_full_batch(cost, e_len)
    k = cost.decode(pol, b)
    step = k.step_s(b, b * (prompt + e_len2 / (2 * e_len)))
    per_sample = e_len * step / b + cost.prefill_s(pol, round(prompt))
    rollout = cost.replicas(pol, g) / per_sample
    # Judge: prefill of template + prompt + response, then a short verdict decode.
    jctx = [cost.judge_prompt_tokens(prompt - 1, x) for x in resp]
    e_j = sum(jctx) / len(jctx)
    bj = cost.max_seqs(jud, e_j + wl.verdict_tokens)
    kj = cost.decode(jud, bj)
    stepj = kj.step_s(bj, bj * (e_j + wl.verdict_tokens / 2))
    prefill_j = sum(cost.prefill_s(jud, round(x)) for x in jctx) / len(jctx)
    genrm = cost.replicas(jud, g) / (wl.verdict_tokens * stepj / bj + prefill_j)
    # Train: all tokens of a sample, forward and backward (forward only in a step without
    # signal, where that is measured: its share is the chance no group has one).
    tokens = prompt + e_len
    p_sig = signal_chance(wl)
    per_1000 = p_sig * cost.train_s(round(tokens * 1000), 1000, g) + (1 - p_sig) * cost.train_s(
        round(tokens * 1000), 1000, g, signal=False)
    trainer = 1000 / per_1000
    # Critical path: the longest sequence alone at batch 1, its judging, the train step.
    n = wl.samples_per_step
    longest = expected_max(wl.response, n, wl.group_size)
    k1 = cost.decode(pol, 1)
    decode = longest * (k1.base + k1.per_seq + k1.per_ctx * prompt) + k1.per_ctx * longest**2 / 2
    kj1 = cost.decode(jud, 1)
    jlen = cost.judge_prompt_tokens(prompt - 1, longest)
    judge = cost.prefill_s(jud, round(jlen)) + wl.verdict_tokens * kj1.step_s(1, jlen)
    train = n * g / (trainer * wl.gpus)  # the whole cluster trains the step
    step_tokens = round(n * tokens)
    dp = {  # data parallel as measured (far from linear on a CPU), new groups aside
        w: p_sig * t + (1 - p_sig) * t0
        for w in range(2, wl.gpus // g + 1)
        if (t := cost.train_world_s(step_tokens, w, True, False)) is not None
        and (t0 := cost.train_world_s(step_tokens, w, False, False)) is not None
    }
    if dp:
        train = min([n / trainer, *dp.values()])
    path = cost.prefill_s(pol, round(prompt)) + decode + judge + train
    return RoleRates(rollout, genrm, trainer, path, decode, tuple(dp.items()))


def rollout_full_batch(cost: CostModel, mean_response: float) -> int:
    """The batch a rollout replica holds when every sequence has the mean context (prompt, BOS
    and mean response): the work limit's full batch."""
    return cost.max_seqs(cost.wl.policy, cost.mean_prompt() + 1 + mean_response)


def policy_replicas(wl: Workload, cost: CostModel) -> int:
    """Policy replicas the whole cluster runs at once (a step's tail spread over all of them)."""
    return concurrent_devices(wl) // wl.group_gpus * cost.replicas(wl.policy, wl.group_gpus)


def nonclairvoyant_decode_s(wl: Workload) -> float:
    """The longest sequence's decode when no response length is known before its end: at its
    ``k``-th token every sequence still unfinished decodes one too (any of them may be the
    longest), spread evenly over every policy replica of the cluster, at least one a replica."""
    n = wl.samples_per_step
    return _unfinished_decode_s(wl, n, expected_max(wl.response, n, wl.group_size))


def _unfinished_decode_s(wl: Workload, n: float, tokens: float) -> float:
    """Decoding ``n`` sequences for ``tokens`` steps, each step's batch the sequences still
    unfinished by then, spread evenly over every policy replica (at least one a replica)."""
    cost = CostModel(wl)
    pol, r = wl.policy, wl.response
    replicas = policy_replicas(wl, cost)
    prompt = cost.mean_prompt() + 1  # BOS
    nd = NormalDist()
    total = 0.0
    for k in range(math.ceil(tokens)):
        # unfinished after k tokens: P(length > k) of the capped log-normal (k is below the cap)
        if k == 0 or r.sigma == 0:
            alive = n if k < r.median else 0.0
        else:
            alive = n * (1 - nd.cdf(math.log(k / r.median) / r.sigma))
        b = max(alive / replicas, 1.0)
        total += cost.decode(pol, b).step_s(b, b * (prompt + k))
    return total


def nonclairvoyant_partial_decode_s(wl: Workload, over_sample: float) -> float:
    """The non-clairvoyant decode of a step under partial rollouts with over-sampling
    (``--set partial_rollout=true, over_sample=o``): the step trains the first complete
    ``n / group_size`` groups of the ``n (1 + o')`` sequences admitted (any ``o' <= o``: a
    scheduler may admit fewer), so it waits for the group-max quantile ``(1 + o')^(-1/G)``'s
    length, not the longest; meanwhile every unfinished sequence decodes (any may end a group),
    spread evenly over every policy replica. Without over-sampling partial rollouts shorten no
    step: the oldest-token bound (``max_staleness``) still makes a step wait for every group
    started ``max_staleness`` versions back, so this is ``nonclairvoyant_decode_s`` (o = 0)."""
    if over_sample <= 0:
        return nonclairvoyant_decode_s(wl)
    return min(_unfinished_decode_s(wl, n, end)
               for n, end in nonclairvoyant_partial_end(wl, over_sample))


def nonclairvoyant_partial_end(wl: Workload, over_sample: float) -> list[tuple[float, float]]:
    """The ``(sequences admitted, tokens until the step's groups are complete)`` a scheduler may
    choose under partial rollouts with ``over_sample`` (see ``nonclairvoyant_partial_decode_s``);
    without over-sampling the one choice: the step's samples and the longest of them."""
    n0 = wl.samples_per_step
    if over_sample <= 0:
        return [(float(n0), expected_max(wl.response, n0, wl.group_size))]
    r = wl.response
    nd = NormalDist()
    out = []
    for share in (0.0, 0.25, 0.5, 0.75, 1.0):  # o' = share * o
        o = share * over_sample
        n = n0 * (1 + o)
        groups = n / wl.group_size
        # the (n / G)-th complete group of n (1 + o) / G: the group max's quantile 1/(1+o)
        # (o = 0: the largest of ``groups``, as ``expected_max``)
        q_group = 1 / (1 + o) * groups / (groups + 1)
        if r.group_share and r.sigma:  # a group's responses alike: its max's own quantile
            end = group_max_tokens(r, 1, wl.group_size, q_group)
        else:
            q = q_group ** (1 / wl.group_size)
            end = min(r.cap, r.median * math.exp(r.sigma * nd.inv_cdf(q))) if r.sigma else r.median
        out.append((n, end))
    return out


def data_parallel_work_bound(wl: Workload, r: RoleRates, extra_s: float = 0.0) -> float:
    """Samples/s with every device busy, steps one at a time. A sample takes ``a`` worker-
    seconds of generation and judging, and ``t_w`` seconds of a step on ``w`` trainers, which
    hold ``min(w, devices)`` devices meanwhile. Where data parallel is linear (the GPU cost
    model) a step spreads over every device and this is the plain work bound; where it is
    measured (2 CPU trainers run 1.3x one) it is the best mix of step widths: a linear
    program whose optimum mixes at most two widths, so every pair is tried. ``extra_s``: more
    worker-seconds each sample's generation needs (``joint_bound``'s excess)."""
    workers = wl.gpus // wl.group_gpus
    devices = concurrent_devices(wl) / wl.group_gpus
    n = wl.samples_per_step
    a, t1 = 1 / r.rollout + 1 / r.genrm + extra_s, 1 / r.trainer
    widths = [(t1, t1)]  # (step seconds a sample, device-seconds a sample)
    widths += [(s / n, min(w, devices) * s / n) for w, s in r.dp_step_s]
    if workers > 1 and workers not in dict(r.dp_step_s):  # the widest linear step
        widths.append((t1 / workers, min(workers, devices) * t1 / workers))
    best = math.inf
    for (ti, ci), (tj, cj) in itertools.product(widths, repeat=2):
        # a share f of the samples on width j: T(f) = max(trainers' time, devices' time)
        da, db = tj - ti, (cj - ci) / devices
        base = (a + ci) / devices
        shares = [0.0, 1.0]
        if da != db and 0 < (f := (base - ti) / (da - db)) < 1:
            shares.append(f)
        best = min(best, *(max(ti + f * da, base + f * db) for f in shares))
    return 1 / best


def concurrent_devices(wl: Workload) -> int:
    """GPUs that can run at once: on a CPU machine the workers share ``cores``."""
    g = wl.group_gpus
    return min(wl.gpus, wl.hardware.cores * g) if wl.hardware.cores else wl.gpus


def signal_chance(wl: Workload) -> float:
    """The chance a step has any nonzero advantage: some group's verdicts are not all equal."""
    p, n = wl.p_yes, wl.group_size
    flat = (1 - p) ** n + p**n  # one group all No or all Yes
    return 1 - flat**wl.prompts_per_step


def drift_steps(wl: Workload) -> range:
    """The steps a drifting run's bounds and rates are taken over: after the first (the
    pipeline's fill, which the measured rates leave out too) to the last."""
    return range(1, wl.steps) if wl.steps > 1 else range(wl.steps)


def fluid_bound(wl: Workload) -> dict[str, float]:
    """The perfect scheduler's samples/s and the two limits it is the smaller of; and the
    same for a scheduler that cannot see response lengths ahead (``nonclairvoyant_*``: the
    critical path with ``nonclairvoyant_decode_s`` in place of the batch-1 decode).

    A drifting workload's bound is each step's (``wl.at(step)``) run for one step: the run's
    samples over the sum of the steps' bounded times (``drift_steps``); its seconds (paths,
    GPU-seconds) are the mean over those steps."""
    if wl.schedule is not None:
        per = [fluid_bound(wl.at(k)) for k in drift_steps(wl)]
        out = {}
        for key in per[0]:
            if key.endswith(("path_s", "per_sample")):  # seconds
                out[key] = sum(b[key] for b in per) / len(per)
            else:  # a rate: the same samples each step, so the harmonic mean
                out[key] = len(per) / sum(1 / b[key] for b in per)
        return out
    r = role_rates(wl)
    g = wl.group_gpus
    work_gpu_s = g / r.rollout + g / r.genrm + g / r.trainer
    work = concurrent_devices(wl) / work_gpu_s
    dp_work = min(work, data_parallel_work_bound(wl, r))  # (equal where it is linear)
    per_path = wl.samples_per_step * (wl.max_staleness + 1)
    path = per_path / r.critical_path_s
    nc_path_s = r.critical_path_s - r.decode_s + max(r.decode_s, nonclairvoyant_decode_s(wl))
    return {
        "samples_per_s": min(dp_work, path),
        "work_bound": work,
        "data_parallel_work_bound": dp_work,
        "critical_path_bound": path,
        "critical_path_s": r.critical_path_s,
        "gpu_s_per_sample": work_gpu_s,
        "nonclairvoyant_samples_per_s": min(dp_work, per_path / nc_path_s),
        "nonclairvoyant_critical_path_s": nc_path_s,
    }


def rank_splits(wl: Workload, top: int = 8) -> list[tuple[float, dict[str, int]]]:
    """Every split of the workers into (rollout, genrm, trainer), each >= 1, scored by the
    pipeline's analytic throughput (the slowest pool, capped by the critical path); the best
    ``top`` first. A drifting workload's score is over its whole run (the split chosen with
    hindsight): each step at its own rates, the run's samples over the sum of the steps'
    times."""
    stationary = [wl] if wl.schedule is None else [wl.at(k) for k in drift_steps(wl)]
    per = []
    for w in stationary:
        r = role_rates(w)
        per.append((r, w.samples_per_step * (w.max_staleness + 1) / r.critical_path_s))
    workers = wl.gpus // wl.group_gpus
    scored = []
    for nr in range(1, workers - 1):
        for nj in range(1, workers - nr):
            nt = workers - nr - nj
            steps = [(min(nr * r.rollout, nj * r.genrm, nt * r.trainer), cap) for r, cap in per]
            rates = [min(slowest, cap) for slowest, cap in steps]
            if len(per) == 1:  # (stationary: the plain numbers, no round trip through 1/x)
                score, slack = rates[0], steps[0][0]
            else:
                score = len(rates) / sum(1 / x for x in rates)
                slack = len(steps) / sum(1 / x for x, _ in steps)
            # Ties (all capped) break toward the split with the most slack in its slowest pool.
            scored.append((score, slack, {"rollout": nr, "genrm": nj, "trainer": nt}))
    scored.sort(key=lambda x: (-x[0], -x[1]))
    return [(s, split) for s, _, split in scored[:top]]


def partial_bounds(wl: Workload, over_sample: float = 0.0) -> dict[str, float]:
    """The non-clairvoyant bound for partial rollouts with ``over_sample`` (samples/s, beside
    ``fluid_bound``'s keys, which stay as they are): its critical path with
    ``nonclairvoyant_partial_decode_s``. The groups over-sampling refuses are counted as free
    work (their cut tails are thrown away in this setting), so it is an upper bound; with
    ``over_sample`` 0 it is the non-clairvoyant bound itself, and where the work bound binds no
    partial-rollout setting raises it. A drifting workload's is each step's, combined as
    ``fluid_bound`` combines its."""
    if wl.schedule is not None:
        per = [partial_bounds(wl.at(k), over_sample) for k in drift_steps(wl)]
        return {key: len(per) / sum(1 / b[key] for b in per) for key in per[0]}
    r = role_rates(wl)
    g = wl.group_gpus
    dp_work = min(concurrent_devices(wl) / (g / r.rollout + g / r.genrm + g / r.trainer),
                  data_parallel_work_bound(wl, r))
    per_path = wl.samples_per_step * (wl.max_staleness + 1)
    nc_path = r.critical_path_s - r.decode_s + max(r.decode_s, nonclairvoyant_decode_s(wl))
    part_path = r.critical_path_s - r.decode_s + nonclairvoyant_partial_decode_s(wl, over_sample)
    part_path = min(nc_path, part_path)  # (a scheduler may over-sample nothing)
    return {"nonclairvoyant_partial_samples_per_s": min(dp_work, per_path / part_path),
            "nonclairvoyant_partial_critical_path_s": part_path}
