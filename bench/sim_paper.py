"""The paper's comparison on simulated clusters: colocated vs best static vs backpressure.

For each workload in bench/workloads/ and each GPU count: samples/s of the colocated planner
(if ``make_planner("colocated")`` exists), of the best static split (every split ranked by the
analytic pipeline model, the best ``--static-candidates`` of them simulated), and of the
backpressure planner (starting from the best analytic split); the ratios; each as a fraction
of the fluid bound; shift times; and the simulator's own speed (wall seconds per simulated
hour). Everything runs the real controller and planners in virtual time.

    python bench/sim_paper.py --out bench/results/sim_paper             # 128 GPUs
    python bench/sim_paper.py --gpus 128,512,1024 --out ...              # slow: minutes per run

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

from pivotflow.planner import PLANNERS
from pivotflow.sim.cluster import SimResult, Split, simulate
from pivotflow.sim.fluid import fluid_bound, rank_splits
from pivotflow.sim.workload import load_workload

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


def run_one(
    path: str, gpus: int, args: argparse.Namespace, keep: list[SimResult]
) -> dict[str, Any]:
    wl = load_workload(path).scaled(gpus)
    fluid = fluid_bound(wl)
    f = fluid["samples_per_s"]
    workers = wl.gpus // wl.group_gpus
    kw = {"steps": args.steps, "wall_limit_s": args.wall_limit_s}
    ranked = rank_splits(wl, top=args.static_candidates)
    static = [simulate(wl, "static", Split(**split), **kw) for _, split in ranked]
    best = max(static, key=lambda r: r.samples_per_s)
    bp = simulate(wl, "backpressure", Split(**ranked[0][1]), **kw)
    keep.append(bp)
    rows = [_row(r, f) for r in static] + [_row(bp, f)]
    colo = None
    if "colocated" in PLANNERS:
        colo = simulate(wl, "colocated", Split(workers - 2, 1, 1), **kw)
        rows.append(_row(colo, f))
    out = {
        "workload": wl.name,
        "gpus": gpus,
        "fluid": {k: round(v, 4) for k, v in fluid.items()},
        "colocated": None if colo is None else round(colo.samples_per_s, 4),
        "best_static": round(best.samples_per_s, 4),
        "best_static_split": best.split,
        "static_splits_simulated": len(static),
        "static_splits_ranked": "all (analytic)",
        "backpressure": round(bp.samples_per_s, 4),
        "backpressure_over_static": round(bp.samples_per_s / best.samples_per_s, 4),
        "backpressure_over_colocated": None
        if colo is None
        else round(bp.samples_per_s / colo.samples_per_s, 4),
        "fraction_of_fluid": {
            "backpressure": round(bp.samples_per_s / f, 4),
            "best_static": round(best.samples_per_s / f, 4),
            "colocated": None if colo is None else round(colo.samples_per_s / f, 4),
        },
        "shift_s": {
            "backpressure_mean": bp.summary()["shift_s_mean"],
            "backpressure_max": bp.summary()["shift_s_max"],
            "colocated_mean": None if colo is None else colo.summary()["shift_s_mean"],
        },
        "sim_wall_s_per_sim_hour": round(bp.wall_s / bp.sim_s * 3600, 1),
        "sim_samples_per_wall_s": round(bp.samples / bp.wall_s, 1),
        "runs": rows,
    }
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=str(HERE / "workloads" / "*.toml"))
    ap.add_argument("--gpus", default="128", help="comma-separated GPU counts")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--static-candidates", type=int, default=3)
    ap.add_argument("--wall-limit-s", type=float, default=900.0, help="per simulated run")
    ap.add_argument("--out", type=Path, default=None, help="results JSON and plots here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    keep: list[SimResult] = []
    results = [
        run_one(p, int(g), args, keep)
        for p in sorted(glob.glob(args.workloads))
        for g in args.gpus.split(",")
    ]
    rows = [row for r in results for row in r["runs"]]
    plots = {}
    if args.out is not None:
        from pivotflow.sim.plots import plot_pools, plot_throughput

        args.out.mkdir(parents=True, exist_ok=True)
        plots["throughput"] = str(plot_throughput(rows, args.out / "throughput.png"))
        plots["pools"] = str(plot_pools(keep[0], args.out / "pools_backpressure.png"))
        (args.out / "results.json").write_text(
            json.dumps(
                {
                    "command": " ".join([sys.executable.split("/")[-1], *sys.argv]),
                    "results": results,
                },
                indent=1,
            )
            + "\n"
        )
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
