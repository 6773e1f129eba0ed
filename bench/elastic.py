"""Elastic pools against the baselines, on real worker processes and the real tiny models.

Workload: graphs/grpo_genrm_longtail.py (the GenRM graph with log-normal response lengths,
p99 = 10x median). Every planner runs the same graph, seed and number of worker processes:

* ``colocated`` — every worker in the same phase (rollout, then judge, then train, DP);
* ``static`` — every static deployment of the workers: each split over the three pools and,
  with fewer workers than pools (or as a candidate anyway), each partition of the pools into
  groups that time-share their workers in phases (``colocate=rollout+genrm``: inference
  workers that roll out and judge, as slime and AReaL deploy a GenRM); the best is the baseline;
* ``backpressure`` — shifts workers where the work is.

Throughput is steady state: samples trained from the end of step 1 to the last step, over that
time (worker start-up and the first step's warm-up left out). By default there are as many
workers as cores: more would let an idle process hand its core to a busy one, hiding the very
waste being measured. With ``--workers`` above the cores the report says so
(``oversubscribed``) and also compares colocated and backpressure at ``cores`` workers. Then
shift latency (parts), and whether shifting changes RL: the plain GenRM graph's task_accuracy
under static (3 workers) and backpressure (2 workers for 3 pools, so it shifts every step), same
seed and steps.

    python bench/elastic.py [--steps 8] [--workers CORES] [--accuracy-steps 30] [--out DIR]
                            [--warm-roles]
    python bench/elastic.py --drift [--drift-steps 12] [--workers 2] [--max-staleness N]
                            [--partial]                          # bench/elastic_drift.py

Prints one JSON object on its last line; writes elastic.png under --out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from pivotflow.metrics import read_metrics
from pivotflow.run import run

ROOT = Path(__file__).resolve().parents[1]
LONGTAIL = ROOT / "graphs" / "grpo_genrm_longtail.py"
GENRM = ROOT / "graphs" / "grpo_genrm.py"
POOLS = ("rollout", "genrm", "trainer")


def steady_rate(out: Path) -> float:
    """Samples per second from the end of step 1 to the end of the last step."""
    recs = read_metrics(out / "metrics.jsonl")
    if len(recs) < 2:
        raise SystemExit(f"{out}: fewer than 2 steps recorded")
    return sum(r["samples"] for r in recs[1:]) / (recs[-1]["time_s"] - recs[0]["time_s"])


def one_run(graph: Path, out: Path, planner: str, steps: int, workers: int | None,
            extra: list[str]) -> dict[str, Any]:
    sets = ["live=false", f"planner={planner}", "seed=0", *extra]
    res = run(graph, sets=sets, out=out, workers=workers, steps=steps, console=False)
    shifts = [json.loads(line) for line in (out / "shifts.jsonl").read_text().splitlines()]
    recs = read_metrics(out / "metrics.jsonl")
    return {"samples_per_s": steady_rate(out), "shifts": res.summary["shifts"],
            "migrations": res.summary["migrations"], "ledger": res.summary["ledger"],
            "shift_records": shifts,
            "accuracy": [r["task_accuracy"] for r in recs]}


def static_deployments(workers: int) -> dict[str, list[str]]:
    """name -> ``--set`` items of every static deployment of ``workers``: the pools split into
    groups (singletons: a plain split, ``static-R-J-T``; a group of several time-shares its
    workers, ``static-rollout+genrm:1-trainer:1``), each group given at least one worker. The
    one-group partition is the colocated planner, measured on its own."""
    out: dict[str, list[str]] = {}
    for groups in _partitions(list(POOLS)):
        if len(groups) < 2 or len(groups) > workers:
            continue
        for counts in itertools.product(range(1, workers + 1), repeat=len(groups)):
            if sum(counts) != workers:
                continue
            sizes = dict.fromkeys(POOLS, 0)
            for group, n in zip(groups, counts, strict=True):
                sizes[group[0]] = n
            sets = [f"pools.{p}={n}" for p, n in sizes.items()]
            if len(groups) == len(POOLS):
                out["static-" + "-".join(str(sizes[p]) for p in POOLS)] = sets
            else:
                shared = ",".join("+".join(g) for g in groups if len(g) > 1)
                name = "-".join(f"{'+'.join(g)}:{n}" for g, n in zip(groups, counts, strict=True))
                out[f"static-{name}"] = [*sets, f"colocate={shared}"]
    return out


def _partitions(items: list[str]) -> list[list[tuple[str, ...]]]:
    """Every set partition of ``items`` (groups and their members in ``items`` order)."""
    if not items:
        return [[]]
    first, rest = items[0], items[1:]
    out = []
    for part in _partitions(rest):
        out.append([(first,), *part])
        for i, group in enumerate(part):
            out.append([*part[:i], (first, *group), *part[i + 1:]])
    return [sorted(p, key=lambda g: POOLS.index(g[0])) for p in out]


def shift_latency(records: list[dict[str, Any]]) -> dict[str, float | int | None]:
    """Median (and p90 of the total) of each timed part, in milliseconds."""
    def ms(key: str, q: float = 0.5) -> float | None:
        vals = sorted(r[key] for r in records if r.get(key) is not None)
        return round(vals[min(len(vals) - 1, int(q * len(vals)))] * 1e3, 2) if vals else None
    return {"n": len(records), "total_p50_ms": ms("total_s"), "total_p90_ms": ms("total_s", 0.9),
            "drain_p50_ms": ms("drain_s"), "release_p50_ms": ms("release_s"),
            "load_p50_ms": ms("load_s"), "warmup_p50_ms": ms("warmup_s")}


def plot(path: Path, rates: dict[str, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    names = list(rates)
    ax.bar(names, [rates[n] for n in names], color=["#999", "#69c", "#e73", "#bbb", "#f95"])
    ax.set_ylabel("samples/s (steady state)")
    ax.set_title("GenRM long-tail workload: planners on the same workers")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--accuracy-steps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--drift", action="store_true",
                    help="the drifting workload (issue 24; bench/elastic_drift.py)")
    ap.add_argument("--drift-steps", type=int, default=12)
    ap.add_argument("--json", type=Path, default=None, help="--drift: also write the JSON here")
    ap.add_argument("--no-adaptive", action="store_true", help="--drift: skip the adaptive run")
    ap.add_argument("--max-staleness", type=int, default=None,
                    help="--drift: every run at this max_staleness (default: the graph's, 0)")
    ap.add_argument("--partial", action="store_true",
                    help="--drift: also run each baseline with --set partial_rollout=true")
    ap.add_argument("--warm-roles", action="store_true",
                    help="every run with --set warm_roles=true (workers keep the roles they "
                         "leave loaded)")
    args = ap.parse_args()
    if args.drift:
        import elastic_drift  # a sibling script (bench/ is on sys.path when run as a script)

        return elastic_drift.main(args, sys.argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="pivotflow-elastic-"))
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    w = args.workers
    if w < 2:
        raise SystemExit("--workers must be >= 2: a static deployment needs a worker for "
                         "generation and one for training")
    warm = ["warm_roles=true"] if args.warm_roles else []
    runs: dict[str, dict[str, Any]] = {}
    for planner in ("colocated", "backpressure"):
        runs[planner] = one_run(LONGTAIL, out / planner, planner, args.steps, w, warm)
        print(f"{planner}: {runs[planner]['samples_per_s']:.1f} samples/s", file=sys.stderr)
    static: dict[str, float] = {}
    for name, sets in static_deployments(w).items():
        static[name] = one_run(LONGTAIL, out / name, "static", args.steps, None,
                               [*sets, *warm])["samples_per_s"]
        print(f"{name}: {static[name]:.1f} samples/s", file=sys.stderr)
    best = max(static, key=lambda k: static[k])
    at_cores: dict[str, Any] = {}
    if cores < w:  # the same comparison with nothing oversubscribed
        for planner in ("colocated", "backpressure"):
            at_cores[planner] = one_run(LONGTAIL, out / f"{planner}-w{cores}", planner,
                                        args.steps, cores, warm)["samples_per_s"]
        at_static = {name: one_run(LONGTAIL, out / f"{name}-w{cores}", "static", args.steps,
                                   None, [*sets, *warm])["samples_per_s"]
                     for name, sets in static_deployments(cores).items()}
        if at_static:
            at_cores["static_best_split"] = max(at_static, key=lambda k: at_static[k])
            at_cores["static_best"] = at_static[at_cores["static_best_split"]]
    # RL unchanged by shifting: backpressure on 2 workers for 3 pools must shift every step
    # (and trains data-parallel), static keeps one worker per pool; same seed and steps
    acc_runs = {"static": one_run(GENRM, out / "accuracy-static", "static",
                                  args.accuracy_steps, 3, warm),
                "backpressure": one_run(GENRM, out / "accuracy-backpressure", "backpressure",
                                        args.accuracy_steps, 2, warm)}
    acc = {p: r["accuracy"] for p, r in acc_runs.items()}
    diffs = [abs(a - b) for a, b in zip(acc["static"], acc["backpressure"], strict=True)
             if a is not None and b is not None]
    bp, co = runs["backpressure"]["samples_per_s"], runs["colocated"]["samples_per_s"]
    rates = {"colocated": co, "best static": static[best], "backpressure": bp}
    if at_cores:
        rates |= {f"colocated w{cores}": at_cores["colocated"],
                  f"backpressure w{cores}": at_cores["backpressure"]}
    plot(out / "elastic.png", rates)
    shifts = runs["backpressure"]["shift_records"] + runs["colocated"]["shift_records"]
    result = {
        "bench": "elastic", "workload": LONGTAIL.name, "steps": args.steps, "workers": w,
        "warm_roles": args.warm_roles,
        "cores": cores, "oversubscribed": w > cores,
        "samples_per_s": {"colocated": co, "static_best": static[best], "backpressure": bp},
        "static_best_split": best, "static_splits": static,
        "backpressure_vs_colocated": bp / co, "backpressure_vs_best_static": bp / static[best],
        "at_cores": {**at_cores, "ratio": (at_cores["backpressure"] / at_cores["colocated"])
                     if at_cores else None,
                     "ratio_vs_best_static": (at_cores["backpressure"] / at_cores["static_best"])
                     if "static_best" in at_cores else None},
        "shifts": {p: runs[p]["shifts"] for p in runs},
        "migrations": {p: runs[p]["migrations"] for p in runs},
        "lost": {p: runs[p]["ledger"]["lost"] for p in runs},
        "duplicates": {p: runs[p]["ledger"]["duplicates"] for p in runs},
        "shift_latency": shift_latency(shifts),
        "shift_latency_backpressure": shift_latency(runs["backpressure"]["shift_records"]),
        "accuracy": {"steps": args.accuracy_steps, **acc,
                     "shifts_backpressure": acc_runs["backpressure"]["shifts"],
                     "migrations_backpressure": acc_runs["backpressure"]["migrations"],
                     "mean_abs_diff": statistics.fmean(diffs) if diffs else None,
                     "last5_static": statistics.fmean(acc["static"][-5:]),
                     "last5_backpressure": statistics.fmean(acc["backpressure"][-5:])},
        "out": str(out),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
