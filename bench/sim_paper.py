"""The paper's comparison on simulated clusters: colocated vs best static vs backpressure.

For each workload in bench/workloads/ and each GPU count: samples/s of the colocated planner
(if ``make_planner("colocated")`` exists), of the best static split (every split ranked by the
analytic pipeline model, the best ``--static-candidates`` of them simulated), and of the
backpressure planner (starting from the best analytic split); the ratios; each as a fraction
of the fluid bound; shift times; and the simulator's own speed (wall seconds per simulated
hour). Everything runs the real controller and planners in virtual time.

    python bench/sim_paper.py --out bench/results/sim_paper.json        # 128 GPUs
    python bench/sim_paper.py --gpus 512 --workloads 'bench/workloads/dense7b*.toml' \
        --out bench/results/sim_paper.json --merge                       # add groups to it

``--out`` writes the JSON there and the plots next to it (``<stem>_throughput.png``,
``<stem>_pools.png``); ``--merge`` keeps the groups already in that file that this run does not
redo, so a long comparison can be made a few groups at a time.

Calibration: ``--calibrate bench/workloads/cpu_tiny_longtail_w2.toml --real colocated=54.6,...``
(or ``--real-json`` with the output files of one or more ``bench/elastic.py`` runs) simulates
that workload (its workers started as the bench starts them, its steps) under each planner
measured, the static baseline as the best of the bench's static deployments, takes the steady
rate as ``bench/elastic.py`` does (samples after step 1 over the time from step 1 to the last),
and prints the simulator's prediction error against the mean of the measured figures, with
their spread.

Each group is also reported against two bounds: the fluid bound and the bound of a scheduler
that learns a response's length only at its end (``fraction_of_nonclairvoyant``), and
``ceilings`` says how far over each baseline any planner could go. ``--resummarize --out FILE``
rewrites FILE's summaries and throughput plot from its stored runs (after a bound changed),
simulating nothing.

Drift (issue 24): ``--drift [--gpus N]`` runs the drifting workloads of
``bench/workloads/drift/`` instead (``bench/sim_drift.py`` says what each baseline is): per group
and size ``carried_over_over_fresh``, ``vs_early_static``, ``vs_best_static``, ``vs_colocated``,
``fraction_of_nonclairvoyant`` and the bounds; ``--out`` writes them with the plots
``<stem>_regimes.png`` (samples/s per planner and regime) and ``<stem>_pools.png`` (pool sizes
over each drifting run, re-sizings marked). ``--partial`` runs every whole-run baseline again
with partial rollouts on and adds a ``partial_rollout`` block (its rates, ratios among the runs
with them on, on over off, and the non-clairvoyant bound for that setting).

    python bench/sim_paper.py --drift --out bench/results/sim_drift.json

Prints one JSON object as the last line of stdout.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import time
from pathlib import Path
from typing import Any

from pivotflow.config import RunConfig
from pivotflow.planner import PLANNERS, make_planner, parse_groups
from pivotflow.run import plan_workers
from pivotflow.sim.cluster import POOLS, SimResult, Split, sim_graph, simulate
from pivotflow.sim.fluid import rank_splits
from pivotflow.sim.joint_bound import bounds
from pivotflow.sim.workload import Workload, load_workload

HERE = Path(__file__).parent


def _row(r: SimResult, fluid: float) -> dict[str, Any]:
    s = r.summary()
    return {
        **{
            k: s[k]
            for k in (
                "workload",
                "planner",
                "gpus",
                "split",
                "samples_per_s",
                "sim_s",
                "wall_s",
                "shifts",
                "shift_s_mean",
                "shift_s_max",
                "samples",
                "timed_out",
            )
        },
        "fluid": fluid,
        "fraction_of_fluid": round(r.samples_per_s / fluid, 4),
    }


def run_group(
    path: str, gpus: int, args: argparse.Namespace, keep: list[SimResult]
) -> tuple[str, dict[str, float], list[dict[str, Any]]]:
    """Simulate the planners of ``args.planners`` on one workload and cluster size."""
    wl = load_workload(path).scaled(gpus)
    fluid = bounds(wl)
    f = fluid["samples_per_s"]
    workers = wl.gpus // wl.group_gpus
    kw = {"steps": args.steps, "wall_limit_s": args.wall_limit_s}
    ranked = rank_splits(wl, top=args.static_candidates)
    runs: list[SimResult] = []
    if "static" in args.planners:
        runs += [simulate(wl, "static", Split(**split), **kw) for _, split in ranked]
    if "backpressure" in args.planners:
        runs.append(simulate(wl, "backpressure", Split(**ranked[0][1]), **kw))
        keep.append(runs[-1])
    if "colocated" in args.planners and "colocated" in PLANNERS:
        runs.append(simulate(wl, "colocated", Split.colocated(workers), **kw))
    return wl.name, fluid, [_row(r, f) for r in runs]


def summarize(name: str, gpus: int, fluid: dict[str, float], rows: list[dict[str, Any]]) -> dict:
    """One group's comparison from its runs (any planner may be missing: None)."""
    f = fluid["samples_per_s"]
    nc = fluid["nonclairvoyant_samples_per_s"]
    static = [r for r in rows if r["planner"] == "static"]
    best = max(static, key=lambda r: r["samples_per_s"]) if static else None
    bp = next((r for r in rows if r["planner"] == "backpressure"), None)
    colo = next((r for r in rows if r["planner"] == "colocated"), None)

    def rate(r: dict[str, Any] | None) -> float | None:
        return None if r is None else r["samples_per_s"]

    def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
        return None if a is None or b is None else round(a["samples_per_s"] / b["samples_per_s"], 4)

    def share(r: dict[str, Any] | None, bound: float) -> float | None:
        return None if r is None else round(r["samples_per_s"] / bound, 4)

    planners = {"backpressure": bp, "best_static": best, "colocated": colo}

    return {
        "workload": name,
        "gpus": gpus,
        "fluid": {k: round(v, 4) for k, v in fluid.items()},
        "colocated": rate(colo),
        "best_static": rate(best),
        "best_static_split": None if best is None else best["split"],
        "static_splits_simulated": len(static),
        "static_splits_ranked": "all (analytic)",
        "backpressure": rate(bp),
        "backpressure_over_static": ratio(bp, best),
        "backpressure_over_colocated": ratio(bp, colo),
        "fraction_of_fluid": {k: share(r, f) for k, r in planners.items()},
        "fraction_of_nonclairvoyant": {k: share(r, nc) for k, r in planners.items()},
        "fraction_of_joint": {k: share(r, fluid["joint_samples_per_s"])
                              for k, r in planners.items()},
        "ceilings": ceilings(fluid, {"best_static": rate(best), "colocated": rate(colo)}),
        "shift_s": {
            "backpressure_mean": None if bp is None else bp["shift_s_mean"],
            "backpressure_max": None if bp is None else bp["shift_s_max"],
            "colocated_mean": None if colo is None else colo["shift_s_mean"],
        },
        "sim_wall_s_per_sim_hour": None
        if bp is None
        else round(bp["wall_s"] / bp["sim_s"] * 3600, 1),
        "sim_samples_per_wall_s": None if bp is None else round(bp["samples"] / bp["wall_s"], 1),
        "runs": rows,
    }


def calibrate(path: str, real: dict[str, list[float]],
              static_tried: set[str] | None = None, warm_roles: bool = False) -> dict[str, Any]:
    """Simulated vs measured samples/s (the mean of each planner's runs in ``real``) on
    workload ``path``, each planner starting as ``bench/elastic.py`` starts it (the workers
    spread over the pools as ``pivotflow run --workers N`` spreads them; colocated all in the
    rollout) and the static baseline the best of the static deployments the measured runs tried
    (``static_tried``, their names; None: every one the bench tries now); ``warm_roles``: the
    runs kept their workers' roles loaded (``bench/elastic.py --warm-roles``), and so do the
    simulated ones."""
    wl = load_workload(path)
    workers = wl.gpus // wl.group_gpus
    out: dict[str, Any] = {"workload": wl.name, "planners": {}, "warm_roles": warm_roles}
    ctl = {"warm_roles": True} if warm_roles else None
    for planner, runs in real.items():
        if planner == "static":
            rate = max(_steady(simulate(wl, make_planner("static", groups), split,
                                        controller=ctl))
                       for name, (groups, split) in static_deployments(workers).items()
                       if static_tried is None or name in static_tried)
        else:
            rate = _steady(simulate(wl, planner, _started_as_run(wl, planner, workers),
                                    controller=ctl))
        measured = sum(runs) / len(runs)
        out["planners"][planner] = {
            "simulated": round(rate, 2),
            "measured": round(measured, 2),
            "measured_runs": [round(x, 2) for x in runs],
            "error": round(rate / measured - 1, 3),
        }
    fluid = bounds(wl)
    out["bounds"] = {key: round(fluid[key], 2) for key in BOUNDS.values()}
    baselines = {k: got["simulated"] for k, got in out["planners"].items() if k != "backpressure"}
    out["ceilings"] = ceilings(fluid, baselines)
    return out


BOUNDS = {"fluid": "samples_per_s", "nonclairvoyant": "nonclairvoyant_samples_per_s",
          "joint": "joint_samples_per_s"}


def ceilings(fluid: dict[str, float], baselines: dict[str, float | None]) -> dict[str, float | None]:
    """The most any planner could reach over each baseline (``{name: samples/s}``): each bound
    of ``fluid`` over its rate. An aim above one of these asks more than a perfect scheduler
    does."""
    return {
        f"{bound}_over_{name}": None if rate is None else round(fluid[key] / rate, 4)
        for bound, key in BOUNDS.items()
        for name, rate in baselines.items()
    }


def _steady(r: SimResult) -> float:
    """Samples after step 1 over the time from step 1 to the last, as bench/elastic.py."""
    recs = r.records
    return sum(x["samples"] for x in recs[1:]) / (recs[-1]["time_s"] - recs[0]["time_s"])


def _started_as_run(wl: Workload, planner: str, workers: int) -> Split:
    """The split ``pivotflow run --workers N --set planner=P`` starts the graph with (its own
    ``plan_workers``: one a pool in pipeline order, the rest to the generate pools; colocated
    all in the first pool)."""
    graph = sim_graph(wl, Split(1, 1, 1))  # the pools only; plan_workers sizes them
    placed = plan_workers(graph, RunConfig(planner=planner), workers).values()
    return Split(**{p: sum(1 for q in placed if q == p) for p in POOLS})


def static_deployments(workers: int) -> dict[str, tuple[list[tuple[str, ...]], Split]]:
    """bench/elastic.py's static candidates by name, as (colocate groups, initial split)."""
    sys.path.insert(0, str(HERE))
    import elastic  # a sibling script

    out = {}
    for name, sets in elastic.static_deployments(workers).items():
        items = dict(item.split("=", 1) for item in sets)
        sizes = {p: int(items[f"pools.{p}"]) for p in elastic.POOLS}
        groups = parse_groups(items.get("colocate", ""), list(elastic.POOLS))
        out[name] = (groups, Split(**sizes))
    return out


def static_tried(files: list[str]) -> set[str] | None:
    """The static deployments ``bench/elastic.py`` outputs tried (None without any)."""
    names = {n for f in files for n in _last_json(f).get("static_splits", {})}
    return names or None


def warm_tried(files: list[str]) -> bool:
    """Whether the ``bench/elastic.py`` outputs ran with ``--warm-roles`` (all or none: a
    comparison of one with the other is two calibrations)."""
    return warm_of([_last_json(f) for f in files], "--real-json")


def warm_of(docs: list[dict[str, Any]], what: str) -> bool:
    """Whether the ``bench/elastic.py`` JSON objects ``docs`` ran with warm roles; SystemExit
    naming ``what`` (the option that gave them) when some did and some did not."""
    warm = {bool(d.get("warm_roles", False)) for d in docs}
    if len(warm) > 1:
        raise SystemExit(f"{what}: some runs kept warm roles and some did not; "
                         "take each kind on its own")
    return warm == {True}


def _last_json(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text().strip().splitlines()[-1])


def real_rates(sets: str, files: list[str]) -> dict[str, list[float]]:
    """Measured samples/s per planner from ``planner=rate,...`` and ``bench/elastic.py``
    outputs (its JSON line, the last of the file)."""
    real: dict[str, list[float]] = {}
    for item in (x for x in sets.split(",") if x):
        planner, _, rate = item.partition("=")
        real.setdefault(planner, []).append(float(rate))
    names = {"colocated": "colocated", "static_best": "static", "backpressure": "backpressure"}
    for f in files:
        rates = _last_json(f)["samples_per_s"]
        for key, planner in names.items():
            real.setdefault(planner, []).append(rates[key])
    return real


def resummarize(args: argparse.Namespace) -> list[str]:
    """Rewrite ``args.out``'s group summaries from the runs stored in it, with the bounds of
    the workload files as they are now (for keys added since the runs were made); returns the
    groups rewritten."""
    paths = {load_workload(p).name: p for p in glob.glob(args.workloads)}
    groups = json.loads(args.out.read_text())["results"]
    out = []
    for g in groups:
        fluid = bounds(load_workload(paths[g["workload"]]).scaled(g["gpus"]))
        out.append(summarize(g["workload"], g["gpus"], fluid, g["runs"]))
    args.out.write_text(json.dumps({"results": out}, indent=1) + "\n")
    from pivotflow.sim.plots import plot_throughput

    rows = [row for g in out for row in g["runs"]]
    plot_throughput(rows, Path(f"{args.out.with_suffix('')}_throughput.png"), blind_share(out))
    return [f"{g['workload']}@{g['gpus']}" for g in out]


def blind_share(groups: list[dict[str, Any]]) -> dict[tuple[str, int], float]:
    """(workload, gpus) -> the non-clairvoyant bound over the fluid one, for the plot."""
    return {
        (g["workload"], g["gpus"]): g["fluid"]["nonclairvoyant_samples_per_s"]
        / g["fluid"]["samples_per_s"]
        for g in groups
        if "nonclairvoyant_samples_per_s" in g["fluid"]
    }


def drift_main(args: argparse.Namespace) -> int:
    """``--drift``: the drifting groups; one JSON line per group, then the summary."""
    sys.path.insert(0, str(HERE))
    import sim_drift  # a sibling script

    t0 = time.perf_counter()
    command = " ".join(["python", *sys.argv])
    plots: dict[str, str] = {}
    keys = ("carried_over_over_fresh", "vs_early_static", "vs_best_static", "vs_colocated",
            "fraction_of_nonclairvoyant", "fraction_of_joint", "bound", "ceilings",
            "samples_per_s", "resizes",
            "sim_wall_s_per_sim_hour")
    old: list[dict[str, Any]] = []
    if args.out is not None and args.merge and args.out.exists():
        old = json.loads(args.out.read_text())["results"]

    def write(groups: list[dict[str, Any]]) -> None:
        g = groups[-1]
        print(json.dumps({"workload": g["workload"], "gpus": g["gpus"],
                          **{k: g[k] for k in (*keys, "partial_rollout") if k in g}}),
              flush=True)
        if args.out is None:
            return
        from pivotflow.sim.plots import plot_pools_grid, plot_regimes

        stem = args.out.with_suffix("")
        first = [g for g in groups if g["gpus"] == min(x["gpus"] for x in groups)]
        plots["regimes"] = str(plot_regimes(groups, Path(f"{stem}_regimes.png")))
        plots["pools"] = str(plot_pools_grid([g["_results"][args.planner] for g in first],
                                             Path(f"{stem}_pools.png")))
        rows = [{**{k: v for k, v in g.items() if k != "_results"}, "command": command}
                for g in groups]
        done = {(g["workload"], g["gpus"]) for g in rows}
        kept = [g for g in old if (g["workload"], g["gpus"]) not in done]
        everything = sorted([*kept, *rows], key=lambda g: (g["workload"], g["gpus"]))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"results": everything}, indent=1) + "\n")

    groups = sim_drift.run_drift(args, on_group=write)
    print(json.dumps({
        "bench": "sim_paper", "drift": True, "gpus": args.gpus, "planner": args.planner,
        "groups": {f"{g['workload']}@{g['gpus']}": {k: g[k] for k in (*keys, "partial_rollout")
                                                    if k in g} for g in groups},
        "plots": plots, "wall_s": round(time.perf_counter() - t0, 1),
    }))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=str(HERE / "workloads" / "*.toml"))
    ap.add_argument("--gpus", default="128", help="comma-separated GPU counts")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--static-candidates", type=int, default=3)
    ap.add_argument(
        "--planners", default="static,backpressure,colocated", help="which to simulate now"
    )
    ap.add_argument("--wall-limit-s", type=float, default=900.0, help="per simulated run")
    ap.add_argument("--out", type=Path, default=None, help="results JSON (plots next to it)")
    ap.add_argument("--merge", action="store_true", help="keep other groups already in --out")
    ap.add_argument("--calibrate", default=None, help="a workload file to compare with --real")
    ap.add_argument("--real", default="", help="measured samples/s: planner=rate,...")
    ap.add_argument("--real-json", nargs="*", default=[], help="bench/elastic.py outputs")
    ap.add_argument(
        "--resummarize",
        action="store_true",
        help="recompute --out's summaries (bounds, ratios) from its stored runs; simulate nothing",
    )
    ap.add_argument("--drift", action="store_true", help="the drifting workloads (issue 24)")
    ap.add_argument("--drift-workloads", default=str(HERE / "workloads" / "drift" / "*.toml"))
    ap.add_argument("--planner", default="adaptive", help="--drift: the planner carried over")
    ap.add_argument("--late-steps", type=int, default=0,
                    help="--drift: steps of a fresh late run (0: as many as the drifting run, "
                         "so the two are compared on the same steps)")
    ap.add_argument("--jobs", type=int, default=1, help="--drift: simulations run side by side")
    ap.add_argument("--partial", action="store_true",
                    help="--drift: also run every whole-run baseline with partial rollouts on "
                    "(the summary's partial_rollout block)")
    ap.add_argument("--early-candidates", type=int, default=1,
                    help="--drift: early-regime splits simulated to tune the static baseline "
                    "(1: the early regime's analytic split)")
    args = ap.parse_args(argv)
    if args.drift and args.resummarize:
        if args.out is None:
            ap.error("--resummarize needs --out")
        sys.path.insert(0, str(HERE))
        import sim_drift  # a sibling script

        groups = sim_drift.resummarize_drift(json.loads(args.out.read_text())["results"],
                                             args.drift_workloads)
        args.out.write_text(json.dumps({"results": groups}, indent=1) + "\n")
        print(json.dumps({"bench": "sim_paper", "drift": True, "resummarized": [
            f"{g['workload']}@{g['gpus']}" for g in groups]}))
        return 0
    if args.drift:
        return drift_main(args)
    if args.resummarize:
        if args.out is None:
            ap.error("--resummarize needs --out")
        print(json.dumps({"bench": "sim_paper", "resummarized": resummarize(args)}))
        return 0
    if args.calibrate:
        real = real_rates(args.real, args.real_json)
        got = calibrate(args.calibrate, real, static_tried(args.real_json),
                        warm_tried(args.real_json))
        print(json.dumps({"bench": "sim_paper", "calibration": got}))
        return 0
    t0 = time.perf_counter()
    keep: list[SimResult] = []
    args.planners = set(args.planners.split(","))
    old: dict[tuple[str, int], dict[str, Any]] = {}
    if args.out is not None and args.merge and args.out.exists():
        old = {(r["workload"], r["gpus"]): r for r in json.loads(args.out.read_text())["results"]}
    command = " ".join(["python", *sys.argv])
    results = []
    for p in sorted(glob.glob(args.workloads)):
        if Path(p).name.startswith("cpu_"):  # calibration files, not the paper's groups
            continue
        for g in args.gpus.split(","):
            name, fluid, rows = run_group(p, int(g), args, keep)
            for r in rows:
                r["command"] = command
            prev = old.pop((name, int(g)), {"runs": []})
            rows = [r for r in prev["runs"] if r["planner"] not in args.planners] + rows
            results.append(summarize(name, int(g), fluid, rows))
            print(json.dumps({k: v for k, v in results[-1].items() if k != "runs"}), flush=True)
    everything = sorted([*old.values(), *results], key=lambda r: (r["workload"], r["gpus"]))
    plots = {}
    if args.out is not None:
        from pivotflow.sim.plots import plot_pools, plot_throughput

        args.out.parent.mkdir(parents=True, exist_ok=True)
        rows = [row for r in everything for row in r["runs"]]
        stem = args.out.with_suffix("")
        plots["throughput"] = str(plot_throughput(rows, Path(f"{stem}_throughput.png"),
                                                  blind_share(everything)))
        pools_png = Path(f"{stem}_pools.png")
        if keep and not (args.merge and pools_png.exists()):  # the first run's stays
            plots["pools"] = str(plot_pools(keep[0], pools_png))
        args.out.write_text(json.dumps({"results": everything}, indent=1) + "\n")
    summary = {
        "bench": "sim_paper",
        "gpus": args.gpus,
        "steps": args.steps,
        "colocated_available": "colocated" in PLANNERS,
        "groups": {
            f"{r['workload']}@{r['gpus']}": {
                k: r[k]
                for k in (
                    "colocated",
                    "best_static",
                    "backpressure",
                    "backpressure_over_static",
                    "backpressure_over_colocated",
                    "fraction_of_fluid",
                    "fraction_of_nonclairvoyant",
                    "fraction_of_joint",
                    "ceilings",
                    "shift_s",
                    "sim_wall_s_per_sim_hour",
                )
            }
            for r in results
        },
        "plots": plots,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
