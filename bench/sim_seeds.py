"""How far one planner's simulated run moves with the seed: each workload file run at several
seeds (the response lengths, verdicts and arrival order drawn anew; the split, the planner and
every knob the same), from the file's early-regime analytic split as ``bench/sim_paper.py
--drift`` starts its carried-over runs.

Why: the issue-24 figures are single runs at seed 0, and a rule change moves them a few
percent either way; a seed sweep says what is noise, and finds the seeds where a planner
breaks down (2026-12-04: the adaptive planner fell to 9.3 samples/s on dense7b+32b's drift at
seed 1, 0.26 of seed 0's, until its re-size guards were fixed; ``pivotflow/planner/adaptive.py``).

Per run: steady samples/s (as ``pivotflow sim``), the whole run's samples/s (as
``bench/sim_drift.py`` rates a drifting run: the samples after the first step over the time from
its end to the last step's) and virtual seconds to the last step; per workload: min / median /
max of each and max over min of the run time. Last line: one JSON object, with the command.

``--against static,colocated`` also runs those baselines at every seed (``static``: the same
early analytic split, kept; ``colocated``: every worker in one group, started as
``bench/sim_drift.py`` starts it) and reports the planner's whole-run rate over each, per seed
and as min / median / max (``vs_static``, ``vs_colocated``): issue 24's ratios are of seed 0,
and a baseline's run moves with the seed as the planner's does.

    python bench/sim_seeds.py bench/workloads/drift/*.toml --seeds 5 --jobs 2 \
        --out bench/results/sim_seeds_drift.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from pivotflow.planner import PLANNERS
from pivotflow.sim.cluster import Split, simulate
from pivotflow.sim.fluid import rank_splits
from pivotflow.sim.workload import load_workload

sys.path.insert(0, str(Path(__file__).parent))
from sim_drift import run_rate  # noqa: E402  (a sibling script: one definition of a run's rate)


def one_run(path: str, planner: str, seed: int, gpus: int | None,
            steps: int | None) -> dict[str, Any]:
    wl = load_workload(Path(path))
    if gpus:
        wl = wl.scaled(gpus)
    if planner == "colocated":  # (as bench/sim_drift.py starts it)
        split = Split.colocated(wl.gpus // wl.group_gpus)
    else:
        split = Split(**rank_splits(wl.at(0) if wl.schedule else wl, top=1)[0][1])
    res = simulate(wl, planner, split, steps=steps or wl.steps, seed=seed, wall_limit_s=3000.0)
    whole = run_rate(res)
    return {"workload": wl.name, "planner": planner, "seed": seed, "split": split.as_dict(),
            "samples_per_s": round(res.samples_per_s, 3),
            "whole_run_samples_per_s": None if whole is None else round(whole, 4),
            "sim_s": round(res.sim_s, 1), "shifts": len(res.shifts),
            "timed_out": res.timed_out, "wall_s": round(res.wall_s, 1)}


def versus(runs: list[dict[str, Any]], base: list[dict[str, Any]]) -> dict[str, Any]:
    """The planner's whole-run rate over a baseline's, seed by seed (runs and base in seed
    order), with min / median / max."""
    per_seed = [round(a["whole_run_samples_per_s"] / b["whole_run_samples_per_s"], 4)
                for a, b in zip(runs, base, strict=True)
                if a["whole_run_samples_per_s"] and b["whole_run_samples_per_s"]]
    if not per_seed:
        return {"per_seed": []}
    return {"per_seed": per_seed, "min": min(per_seed),
            "median": statistics.median(per_seed), "max": max(per_seed)}


def spread(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["samples_per_s"] for r in runs]
    times = [r["sim_s"] for r in runs]
    return {"seeds": [r["seed"] for r in runs],
            "samples_per_s": {"min": min(rates), "median": statistics.median(rates),
                              "max": max(rates)},
            "sim_s": {"min": min(times), "median": statistics.median(times), "max": max(times)},
            "sim_s_max_over_min": round(max(times) / min(times), 4)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workloads", nargs="+", type=Path)
    p.add_argument("--planner", default="adaptive")
    p.add_argument("--seeds", type=int, default=5, help="seeds 0 .. N-1")
    p.add_argument("--gpus", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--jobs", type=int, default=1, help="simulations run side by side")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    p.add_argument("--against", default="",
                   help="baselines run at every seed too, comma-separated (static, colocated)")
    args = p.parse_args(argv)
    against = [b for b in args.against.split(",") if b]
    for name in [args.planner, *against]:
        if name not in PLANNERS:
            raise SystemExit(f"--planner/--against {name!r}: not a planner "
                             f"(one of {', '.join(sorted(PLANNERS))})")
    for w in args.workloads:  # every file checked before any run
        load_workload(w)
    if args.seeds < 1:
        raise SystemExit(f"--seeds {args.seeds}: at least 1")
    started = time.monotonic()
    tasks = [(str(w), planner, s, args.gpus, args.steps)
             for w in args.workloads for planner in [args.planner, *against]
             for s in range(args.seeds)]
    runs: list[dict[str, Any]] = []
    if args.jobs <= 1:  # in this process (a script loaded by path cannot be pickled to a pool)
        for t in tasks:
            runs.append(one_run(*t))
            print(json.dumps(runs[-1]), flush=True)
    else:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for f in [pool.submit(one_run, *t) for t in tasks]:
                runs.append(f.result())
                print(json.dumps(runs[-1]), flush=True)
    groups: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in runs:
        groups.setdefault(r["workload"], {}).setdefault(r["planner"], []).append(r)
    summary = {}
    for name, by in groups.items():
        rs = by[args.planner]
        summary[name] = {**spread(rs), "runs": rs,
                         **{f"vs_{b}": versus(rs, by[b]) for b in against},
                         **{f"{b}_runs": by[b] for b in against}}
    out = {"bench": "sim_seeds", "planner": args.planner, "gpus": args.gpus,
           "against": against, "groups": summary,
           "wall_s": round(time.monotonic() - started, 1),
           "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
           "command": " ".join(["python bench/sim_seeds.py",
                                *(argv if argv is not None else sys.argv[1:])])}
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
