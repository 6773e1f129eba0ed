"""The drift comparison of issue 24 (``python bench/sim_paper.py --drift``): what a user would
deploy against a planner that follows the workload, on drifting workloads.

Per workload of ``bench/workloads/drift/`` and cluster size, all on the simulated cluster:

* ``early_static``: the static split tuned on the first steps (the best of the early regime's
  top analytic splits, each simulated on the early regime held), then kept for the whole run;
* ``best_static``: the best single static split with hindsight (the whole run's top analytic
  splits, and the early one, each simulated over the whole drifting run);
* ``colocated`` over the whole run;
* ``backpressure`` and ``adaptive`` (backpressure that re-sizes its standing split) carried
  over: started from the early-tuned split and never restarted;
* ``fresh_early`` / ``fresh_late``: the planner started from each regime's own analytic split
  with that regime held, the reference ``carried_over_over_fresh`` is taken against. The fresh
  late run is as long as the drifting run (``--late-steps 0``) so that the two are compared on
  the same steps.

``carried_over_over_fresh`` (per regime, and its minimum per group) sets the carried-over run
against the fresh run over the *same steps* (``steps_compared``; the fresh run's rate there is
``fresh_same_steps``). Sample seeds are drawn in admission order and a response's length is a
pure function of its seed and the version that generates it, so step k of both runs holds the
same prompts and, inside a regime, the same response lengths; a step's time is set by its
longest responses, which swing step to step by 20% and more, and under ``max_staleness 1`` the
steps alternate long and short. Until 2026-12-04 the ratio took the fresh run's steady rate
(its first and last step left out) against three late steps of the carried run: different
steps, different tails, and a 3-step window at either phase of the alternation; that figure is
kept as ``carried_over_over_fresh_steady``. (The early regime's carried-over run *is* its fresh
run up to the first bend of the schedule, so its same-steps ratio is 1 by construction.)

Rates: a whole run's is the samples after its first step over the time from the first step to
the last (the fill left out, as the bound leaves it out); a regime's inside a drifting run is
the same over the steps whose samples were all generated in that regime (the early regime's
versions before the first bend of the schedule, the late regime's from its last point plus
``max_staleness``); a fresh run's is its steady rate (first and last step left out). Bounds: the
fluid and non-clairvoyant bounds of each step's workload, over the same steps
(``pivotflow.sim.fluid.fluid_bound``).

``--partial`` (issue 24 part 5: each baseline with and without partial rollouts) runs every
whole-run baseline again with ``partial_rollout=true`` from the same start; the summary's
``partial_rollout`` block holds those rates, the same ratios taken among the runs with it on,
each run's on over off, the share of trained tokens a boundary carried over, and the
non-clairvoyant bound for that setting (``pivotflow.sim.fluid.partial_bounds``; with no
over-sampling it equals the plain one: a step still waits for its due groups).
"""

from __future__ import annotations

import glob
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from partial_rollout import token_weighted  # a sibling script (bench/ is on sys.path)

from pivotflow.sim.cluster import SimResult, Split, simulate
from pivotflow.sim.fluid import fluid_bound, partial_bounds, rank_splits
from pivotflow.sim.joint_bound import joint_bound
from pivotflow.sim.workload import Workload, load_workload

HERE = Path(__file__).parent
PLANNERS = ("backpressure", "adaptive")


def regime_steps(wl: Workload) -> tuple[int, int]:
    """(first step whose lengths differ from step 0's, the step from which they hold at the
    last point); a stationary workload: (steps, 0)."""
    if wl.schedule is None:
        return wl.steps, 0
    bends = wl.schedule.breakpoints()
    moving = [b for b in bends if wl.at(b) != wl.at(0)]
    first = min(moving, default=wl.steps)
    early_end = max([b for b in bends if b < first], default=0)
    return max(early_end, 1), max(bends)


def regime_held(wl: Workload, regime: str) -> Workload:
    """The stationary workload of a drifting run's ``regime`` ("early": step 0's, "late": the
    last point's), whose bounds a regime's rates are set against."""
    return wl.at(0 if regime == "early" else wl.steps)


def window_rate(records: list[dict[str, Any]], a: int, b: int) -> float | None:
    """Samples of steps ``a+1 .. b`` over the time between step ``a``'s end and ``b``'s."""
    if not 0 <= a < b < len(records):
        return None
    samples = sum(r["samples"] for r in records[a + 1: b + 1])
    return samples / (records[b]["time_s"] - records[a]["time_s"])


def run_rate(r: SimResult) -> float | None:
    return window_rate(r.records, 0, len(r.records) - 1)


RECORD_KEYS = ("samples", "time_s", "response_len_mean", "carried_token_share")


def _sim(job: tuple[Any, ...]) -> SimResult:
    """One simulation in a worker process: (file, gpus, regime step or None: the whole
    drifting run, planner, split, steps, wall limit[, the controller's settings: e.g.
    ``{"partial_rollout": True}``])."""
    path, gpus, at, planner, split, steps, wall, *rest = job
    wl = load_workload(path).scaled(gpus)
    if at is not None:
        wl = wl.at(at)
    r = simulate(wl, planner, Split(**split), steps=steps, wall_limit_s=wall,
                 controller=rest[0] if rest else None)
    r.records = [{k: x.get(k) for k in RECORD_KEYS} for x in r.records]
    return r


class Runner:
    """Runs simulations ``jobs`` at a time (processes), or in this process for 1."""

    def __init__(self, jobs: int) -> None:
        self.pool = ProcessPoolExecutor(jobs) if jobs > 1 else None

    def map(self, jobs: list[tuple[Any, ...]]) -> list[SimResult]:
        if self.pool is None:
            return [_sim(j) for j in jobs]
        return list(self.pool.map(_sim, jobs))


def early_steps(wl: Workload) -> int:
    """Steps of an early-regime run: its steps plus a fill and a drain, at least 4."""
    return max(4, regime_steps(wl)[0] + 2)


def group_jobs(path: str, gpus: int, args: Any) -> tuple[Workload, dict[str, tuple]]:
    """The simulations of one group that need no early-tuned split: the early regime's
    candidates (only when more than one is tried: with one, the early regime's analytic split
    is the tuned one), the whole run's best analytic split with hindsight, colocated, and the
    planner started fresh in each regime."""
    wl = load_workload(path).scaled(gpus)
    workers = wl.gpus // wl.group_gpus
    wall, es = args.wall_limit_s, early_steps(wl)
    jobs: dict[str, tuple] = {}
    early = rank_splits(wl.at(0), top=args.early_candidates)
    if len(early) > 1:
        for i, (_, split) in enumerate(early):
            jobs[f"tune{i}"] = (path, gpus, 0, "static", split, es, wall)
    hind = rank_splits(wl, top=1)[0][1]
    if hind != early[0][1] or len(early) > 1:
        jobs["hindsight"] = (path, gpus, None, "static", hind, wl.steps, wall)
    jobs["colocated"] = (path, gpus, None, "colocated", Split.colocated(workers).as_dict(),
                         wl.steps, wall)
    if wl.schedule is not None:
        jobs["fresh_early"] = (path, gpus, 0, args.planner, early[0][1], es, wall)
        late = rank_splits(wl.at(wl.steps), top=1)[0][1]
        late_steps = args.late_steps or wl.steps  # (as long as the drifting run: see above)
        jobs["fresh_late"] = (path, gpus, wl.steps, args.planner, late, late_steps, wall)
    return wl, jobs


def run_drift(args: Any, on_group: Any = None) -> list[dict[str, Any]]:
    """Every drifting group at every size, one group at a time (its runs side by side,
    ``args.jobs`` at once): the runs above and the summary of each; ``on_group(summary)``
    after each group (to write results as they come)."""
    runner = Runner(args.jobs)
    files = [f for pattern in args.drift_workloads.split(",") for f in sorted(glob.glob(pattern))]
    out = []
    for g in args.gpus.split(","):
        for path in files:
            t0 = time.perf_counter()
            wl, jobs = group_jobs(path, int(g), args)
            names = list(jobs)
            first = dict(zip(names, runner.map([jobs[n] for n in names]), strict=True))
            tuned = [r for n, r in first.items() if n.startswith("tune")]
            early = (max(tuned, key=lambda r: r.samples_per_s).split if tuned
                     else rank_splits(wl.at(0), top=1)[0][1])
            second = {k: (path, int(g), None, k, early, wl.steps, args.wall_limit_s)
                      for k in PLANNERS}
            second["early_static"] = (path, int(g), None, "static", early, wl.steps,
                                      args.wall_limit_s)
            names2 = list(second)
            done = dict(zip(names2, runner.map([second[n] for n in names2]), strict=True))
            whole = {"colocated": first["colocated"], **done}
            candidates = [done["early_static"]] + ([first["hindsight"]] if "hindsight" in first
                                                   else [])
            whole["best_static"] = max(candidates, key=lambda r: run_rate(r) or 0.0)
            pl = {"wl": wl, "whole": whole, "early_split": early, "tuned": tuned,
                  "fresh": {k: first[k] for k in ("fresh_early", "fresh_late") if k in first}}
            if args.partial:
                pl["partial"] = partial_runs(runner, path, int(g), wl, whole, args)
            summary = summarize_drift(pl, args)
            summary["bench_group_wall_s"] = round(time.perf_counter() - t0, 1)
            out.append(summary)
            if on_group is not None:
                on_group(out)
    if runner.pool is not None:
        runner.pool.shutdown()
    return out


PARTIAL = {"partial_rollout": True}


def partial_runs(runner: Runner, path: str, gpus: int, wl: Workload,
                 whole: dict[str, SimResult], args: Any) -> dict[str, SimResult]:
    """Each whole-run baseline again with partial rollouts on (``--set partial_rollout=true``;
    issue 24 part 5): the same planner, starting split and steps, so each pair differs only in
    that setting."""
    jobs = {k: (path, gpus, None, r.planner, r.split, wl.steps, args.wall_limit_s, PARTIAL)
            for k, r in whole.items()}
    names = list(jobs)
    return dict(zip(names, runner.map([jobs[n] for n in names]), strict=True))


def summarize_partial(wl: Workload, main: str, off: dict[str, float | None],
                      partial: dict[str, SimResult]) -> dict[str, Any]:
    """The ``partial_rollout`` block of a drift summary: every baseline's whole-run rate with
    partial rollouts on, its ratios against the baselines *also* with them on, on over off per
    run, and the non-clairvoyant bound for the same setting beside them (``partial_bounds`` at
    ``over_sample`` 0, the setting run; no over-sampling). ``off``: the whole-run rates
    without them."""
    on = {k: run_rate(r) for k, r in partial.items()}
    bound = partial_bounds(wl)["nonclairvoyant_partial_samples_per_s"]
    return {
        "setting": "partial_rollout=true (over_sample 0), every baseline from its own start",
        "samples_per_s": {k: _r(v) for k, v in on.items()},
        "vs_early_static": _ratio(on[main], on["early_static"]),
        "vs_best_static": _ratio(on[main], on["best_static"]),
        "vs_colocated": _ratio(on[main], on["colocated"]),
        "on_over_off": {k: _ratio(on[k], off[k]) for k in on},
        "bound_nonclairvoyant_partial": _r(bound),
        "fraction_of_nonclairvoyant_partial": {k: _ratio(v, bound) for k, v in on.items()},
        "carried_token_share": {k: token_weighted(r.records, "carried_token_share")
                                for k, r in partial.items()},  # (bench/partial_rollout.py's)
        "timed_out": {k: r.timed_out for k, r in partial.items()},
    }


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 4)


def summarize_drift(pl: dict[str, Any], args: Any) -> dict[str, Any]:
    wl: Workload = pl["wl"]
    whole: dict[str, SimResult] = pl["whole"]
    rates = {k: run_rate(r) for k, r in whole.items()}
    fluid = fluid_bound(wl)
    nc, fl = fluid["nonclairvoyant_samples_per_s"], fluid["samples_per_s"]
    main = args.planner
    early_end, late_from = regime_steps(wl)
    s = wl.max_staleness
    regimes: dict[str, Any] = {}
    if wl.schedule is not None:
        n = len(whole[main].records)
        windows = {"early": (0, early_end - 1), "late": (late_from + s - 1, n - 2)}
        for regime, (a, b) in windows.items():
            fresh = pl["fresh"][f"fresh_{regime}"]
            same = window_rate(fresh.records, a, b)  # None: the fresh run is shorter
            row = {"fresh": _r(fresh.samples_per_s), "fresh_split": fresh.split,
                   "fresh_same_steps": _r(same), "steps_compared": [a + 1, b],
                   "bound_nonclairvoyant": _r(fluid_bound(regime_held(wl, regime))[
                       "nonclairvoyant_samples_per_s"])}
            for k, r in whole.items():
                row[k] = _r(window_rate(r.records, a, b))
            ref = row["fresh_same_steps"] if same is not None else row["fresh"]
            row["carried_over_over_fresh"] = _ratio(row[main], ref)
            row["backpressure_carried_over_over_fresh"] = _ratio(row["backpressure"], ref)
            row["carried_over_over_fresh_steady"] = _ratio(row[main], row["fresh"])
            regimes[regime] = row
    carried = [r["carried_over_over_fresh"] for r in regimes.values()]
    resizes = [d for d in whole[main].decision_log if d.get("resize")]
    ceilings = {f"nonclairvoyant_over_{k}": _ratio(nc, rates[k])
                for k in ("early_static", "best_static", "colocated")}
    res = whole[main]
    return add_joint(wl, {
        "workload": wl.name,
        "gpus": wl.gpus,
        "planner": main,
        "steps": wl.steps,
        "schedule_source": wl.schedule.source if wl.schedule is not None else "stationary",
        "carried_over_over_fresh": None if not carried or None in carried else min(carried),
        "vs_early_static": _ratio(rates[main], rates["early_static"]),
        "vs_best_static": _ratio(rates[main], rates["best_static"]),
        "vs_colocated": _ratio(rates[main], rates["colocated"]),
        "fraction_of_nonclairvoyant": {k: _ratio(v, nc) for k, v in rates.items()},
        "fraction_of_fluid": {k: _ratio(v, fl) for k, v in rates.items()},
        "bound": {"fluid": _r(fl), "nonclairvoyant": _r(nc),
                  "work": _r(fluid["data_parallel_work_bound"]),
                  "critical_path": _r(fluid["critical_path_bound"])},
        "ceilings": ceilings,
        "samples_per_s": {k: _r(v) for k, v in rates.items()},
        "backpressure_vs_early_static": _ratio(rates["backpressure"], rates["early_static"]),
        "backpressure_vs_colocated": _ratio(rates["backpressure"], rates["colocated"]),
        "regimes": regimes,
        "splits": {"early_static": pl["early_split"],
                   "best_static": whole["best_static"].split,
                   "early_candidates": {str(i): (r.split, _r(r.samples_per_s))
                                        for i, r in enumerate(pl["tuned"])}},
        "resizes": len(resizes),
        "resizes_evaluated": len(res.planner_log),
        "resize_log": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in e.items()}
                       for e in res.planner_log],
        "shifts": {k: len(r.shifts) for k, r in whole.items()},
        "sim_wall_s_per_sim_hour": round(res.wall_s / res.sim_s * 3600, 1),
        "runs": {k: {"split": r.split, "samples_per_s": _r(rates[k]), "sim_s": round(r.sim_s, 1),
                     "wall_s": round(r.wall_s, 1), "step_times_s": [round(x["time_s"], 1)
                                                                   for x in r.records],
                     "timed_out": r.timed_out}
                 for k, r in whole.items()},
        **({"partial_rollout": summarize_partial(wl, main, rates, pl["partial"])}
           if "partial" in pl else {}),
        "_results": whole,  # (for the plots; not written)
    })


def add_joint(wl: Workload, g: dict[str, Any]) -> dict[str, Any]:
    """A drift summary ``g`` with the joint bound beside the others (``bound.joint``,
    ``fraction_of_joint``, ``ceilings.joint_over_*``, each regime's ``bound_joint``), from its
    rates: a stored summary gains them without simulating (``--drift --resummarize``)."""
    joint = joint_bound(wl)["joint_samples_per_s"]
    rates = g["samples_per_s"]
    g["bound"]["joint"] = _r(joint)
    g["fraction_of_joint"] = {k: _ratio(v, joint) for k, v in rates.items()}
    for k in ("early_static", "best_static", "colocated"):
        g["ceilings"][f"joint_over_{k}"] = _ratio(joint, rates.get(k))
    for regime, row in g.get("regimes", {}).items():
        row["bound_joint"] = _r(joint_bound(regime_held(wl, regime))["joint_samples_per_s"])
    return g


def resummarize_drift(groups: list[dict[str, Any]], pattern: str) -> list[dict[str, Any]]:
    """Stored drift summaries with the bounds added since they were made (see ``add_joint``);
    ``pattern``: the drifting workload files they name."""
    paths = {load_workload(p).name: p for p in sorted(glob.glob(pattern))}
    return [add_joint(load_workload(paths[g["workload"]]).scaled(g["gpus"]), g) for g in groups]
