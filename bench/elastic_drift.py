"""``bench/elastic.py --drift``: the planners on a drifting workload, real processes (issue 24).

graphs/grpo_genrm_longtail.py with ``graph.schedule=bench/workloads/cpu_tiny_longtail_drift.toml``
(responses flat at a median of 24 tokens for the first steps, a ramp, then flat at 96), the
same seed and workers for every run, measured side by side in one sitting:

* ``colocated``; every static deployment of the workers (``elastic.static_deployments``);
* ``static_early_tuned``: the static deployment with the best rate over the early flat steps
  (what a user who profiles the first steps deploys; taken from each static's own full run);
* ``static_best``: the best static over the whole run (chosen with hindsight);
* ``backpressure_carried_over``: backpressure started with the early-tuned split's pool sizes
  and never restarted. Backpressure takes no ``colocate=`` groups (pivotflow/config.py
  ``colocate_groups``), so a colocated split is carried over as its plain pool sizes (a group's
  workers start in its first pool, as the static planner starts them); ``carried_over_from``
  says so;
* ``backpressure``: started as ``pivotflow run --workers N`` starts it (the calibration's
  start; not run again where that is the carried-over start); ``adaptive_carried_over``.

``--max-staleness N`` runs every run (and the bounds and simulator beside them) at that
staleness instead of the graph's default 0: at 0 nothing generates across a step boundary, so
partial rollouts have nothing to carry. ``--partial`` (issue 24 part 5) runs colocated, the early-tuned and best statics and the
carried-over planners again with ``--set partial_rollout=true``, from the same starts: the
JSON's ``partial_rollout`` block has their rates, the ratios among them, each on over off, the
share of trained tokens a step boundary carried over, and the bound for that setting (with no
over-sampling a step still waits for its due groups, so it is the non-clairvoyant bound).

Rates are steady samples/s (``elastic.steady_rate``: after step 1) over the whole run and per
regime (the schedule's early and late flat steps); beside them the simulator's bounds for the
same steps (``pivotflow sim FILE --gpus N``'s ``nonclairvoyant_bound``, and per regime).

    python bench/elastic.py --drift [--drift-steps 12] [--workers 2] [--out DIR] [--json FILE]
                                    [--max-staleness N] [--partial]

Prints one JSON object on its last line; writes elastic_drift.png under --out; ``--json FILE``
also writes the JSON to FILE and the plot beside it. ``python bench/elastic_drift.py --pairs
FILE [--reps 2] [--json OUT]`` runs a ``--partial`` sitting's baselines again, off then on,
back to back: one sitting's single runs move 10% and more on this host.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import elastic  # noqa: E402  (a sibling script)
from partial_rollout import token_weighted  # noqa: E402  (a sibling script)

from pivotflow.metrics import read_metrics  # noqa: E402
from pivotflow.sim.fluid import fluid_bound, partial_bounds  # noqa: E402
from pivotflow.sim.workload import load_workload  # noqa: E402
from pivotflow.tasks.length_budget import BUDGET_KEYS, load_length_schedule  # noqa: E402

DRIFT = elastic.ROOT / "bench" / "workloads" / "cpu_tiny_longtail_drift.toml"
LATE = 10**6  # a step past every schedule point: the late regime's values


def regimes(path: Path, steps: int) -> dict[str, list[int]]:
    """The schedule's flat steps (0-based, the graph's ``group_id // groups_per_step``) of a
    run of ``steps``: ``early`` those after step 0 (the warm-up the steady rate leaves out)
    with step 0's lengths, ``late`` the last ones with the schedule's final lengths (none
    when the run ends before them)."""
    sched = load_length_schedule(path)
    keys = [k for k in BUDGET_KEYS if k in sched.curves]

    def at(step: int) -> tuple[float, ...]:
        return tuple(sched.at(k, step, 0.0) for k in keys)

    early = []
    for s in range(1, steps):
        if at(s) != at(0):
            break
        early.append(s)
    late = [s for s in range(steps) if at(s) == at(LATE) and at(LATE) != at(0)]
    return {"early": early, "late": late}


def rate_over(recs: list[dict[str, Any]], steps: list[int]) -> float | None:
    """Samples/s over contiguous 0-based ``steps`` (metrics records; each step's time runs
    from the end of the step before it)."""
    if not steps or steps[0] < 1 or steps[-1] >= len(recs):
        return None
    a, b = steps[0], steps[-1]
    return sum(r["samples"] for r in recs[a:b + 1]) / (recs[b]["time_s"] - recs[a - 1]["time_s"])


WARM: list[str] = []  # ["warm_roles=true"] under --warm-roles: every run of the bench
STALENESS: list[int] = []  # [N] under --max-staleness N: every run, and the bounds and simulator


def measure(name: str, out: Path, planner: str, steps: int, workers: int | None,
            sets: list[str], reg: dict[str, list[int]]) -> dict[str, Any]:
    got = elastic.one_run(elastic.LONGTAIL, out / name, planner, steps, workers,
                          [*sets, f"graph.schedule={DRIFT}", *WARM,
                           *(f"max_staleness={n}" for n in STALENESS)])
    recs = read_metrics(out / name / "metrics.jsonl")
    got["rates"] = {"whole": got["samples_per_s"],
                    **{k: rate_over(recs, v) for k, v in reg.items()}}
    got["step_samples_per_s"] = [r["samples"] / (r["time_s"] - p["time_s"])
                                 for p, r in zip(recs, recs[1:], strict=False)]
    print(f"{name}: " + ", ".join(f"{k} {v:.1f}" for k, v in got["rates"].items()
                                  if v is not None) + " samples/s", file=sys.stderr)
    return got


def started_sizes(workers: int, planner: str) -> dict[str, int]:
    """Workers per pool ``pivotflow run --workers N --set planner=P`` starts the graph with
    (pivotflow/run.py ``plan_workers``)."""
    from pivotflow.config import parse_overrides, resolve
    from pivotflow.graph_check import build_graph, graph_defaults, import_graph_file
    from pivotflow.run import plan_workers

    module = import_graph_file(elastic.LONGTAIL)
    defaults = graph_defaults(module)
    cfg = resolve(parse_overrides([f"planner={planner}", f"graph.schedule={DRIFT}"], defaults),
                  defaults)
    placed = list(plan_workers(build_graph(module, cfg.graph), cfg, workers).values())
    return {p: placed.count(p) for p in elastic.POOLS}


def drift_workload(workers: int, steps: int) -> Any:
    """The drifting CPU workload file as the bench runs it: ``workers`` workers, ``steps``
    steps, and ``--max-staleness`` where given."""
    wl = dataclasses.replace(load_workload(str(DRIFT)).scaled(workers), steps=steps)
    return dataclasses.replace(wl, max_staleness=STALENESS[0]) if STALENESS else wl


def bounds(steps: int, workers: int, reg: dict[str, list[int]]) -> dict[str, Any]:
    """``pivotflow sim DRIFT --gpus W --steps N``'s bounds (the drifting bound: over the steps
    simulated), and each regime's (``wl.at(step)`` over its steps, harmonic mean)."""
    wl = drift_workload(workers, steps)
    whole = fluid_bound(wl)
    out: dict[str, Any] = {"nonclairvoyant_bound": whole["nonclairvoyant_samples_per_s"],
                           "fluid_bound": whole["samples_per_s"], "per_regime": {}}
    # the same over the steps the steady rate counts (after step 1): the fair bound for it
    for name, ks in {**reg, "steady": list(range(1, steps))}.items():
        per = [fluid_bound(wl.at(k)) for k in ks]
        out["per_regime"][name] = None if not per else {
            key: len(per) / sum(1 / b[key] for b in per)
            for key in ("nonclairvoyant_samples_per_s", "samples_per_s")}
    return out


def simulated(steps: int, workers: int, reg: dict[str, list[int]], early_name: str,
              carried: dict[str, int], adaptive: bool) -> dict[str, dict[str, float | None]]:
    """The simulator's rates (whole, per regime; taken as the real ones) for each run of the
    bench, started as the bench starts it: the per-planner calibration on the drift."""
    import sim_paper  # a sibling script

    from pivotflow.planner import make_planner
    from pivotflow.sim.cluster import Split, simulate

    wl = drift_workload(workers, steps)

    def rates(planner: Any, split: Split) -> dict[str, float | None]:
        recs = simulate(wl, planner, split).records
        return {"whole": elastic_rate(recs), **{k: rate_over(recs, v) for k, v in reg.items()}}

    statics = {n: rates(make_planner("static", groups), split)
               for n, (groups, split) in sim_paper.static_deployments(workers).items()}
    best = max(statics, key=lambda n: statics[n]["whole"] or 0.0)
    out = {"colocated": rates("colocated", sim_paper._started_as_run(wl, "colocated", workers)),
           **statics, "static_early_tuned": statics[early_name], "static_best": statics[best],
           "backpressure": rates("backpressure",
                                 sim_paper._started_as_run(wl, "backpressure", workers)),
           "backpressure_carried_over": rates("backpressure", Split(**carried))}
    if adaptive:
        out["adaptive_carried_over"] = rates("adaptive", Split(**carried))
    return out


PARTIAL = "partial_rollout=true"


def partial_arms(w: int, deployments: dict[str, list[str]], early_name: str, best_name: str,
                 carried: list[str], adaptive: bool) -> dict[str, tuple[str, int | None,
                                                                     list[str]]]:
    """The baselines ``--partial`` runs both ways: name -> (planner, ``--workers``, sets)."""
    arms: dict[str, tuple[str, int | None, list[str]]] = {
        "colocated": ("colocated", w, []),
        "static_early_tuned": ("static", None, deployments[early_name]),
        "static_best": ("static", None, deployments[best_name]),
        "backpressure_carried_over": ("backpressure", None, carried)}
    if adaptive:
        arms["adaptive_carried_over"] = ("adaptive", None, carried)
    return arms


def with_partial(out: Path, steps: int, w: int, reg: dict[str, list[int]],
                 off: dict[str, dict[str, Any]], deployments: dict[str, list[str]],
                 early_name: str, best_name: str, carried: list[str]) -> dict[str, Any]:
    """``--partial``: each baseline again with partial rollouts on, started as its run without
    them was (``off``: those runs' rates per regime, which ``on_over_off`` is taken against)."""
    arms = partial_arms(w, deployments, early_name, best_name, carried,
                        "adaptive_carried_over" in off)
    on: dict[str, dict[str, Any]] = {}
    for key, (planner, workers, sets) in arms.items():
        if key == "static_best" and best_name == early_name:  # the same run
            on[key] = on["static_early_tuned"]
            continue
        name = f"{key}-partial"
        on[key] = measure(name, out, planner, steps, workers, [*sets, PARTIAL], reg)
        on[key]["carried_token_share"] = token_weighted(
            read_metrics(out / name / "metrics.jsonl"), "carried_token_share")
    rates = {k: v["rates"] for k, v in on.items()}
    bp = "backpressure_carried_over"
    bound = partial_bounds(drift_workload(w, steps))["nonclairvoyant_partial_samples_per_s"]

    def ratio(a: dict[str, Any], b: dict[str, Any], col: str = "whole") -> float | None:
        x, y = a.get(col), b.get(col)
        return None if x is None or not y else round(x / y, 4)

    return {"setting": PARTIAL, "samples_per_s_per_regime": rates,
            "carried_over_over_early_static": ratio(rates[bp], rates["static_early_tuned"]),
            "vs_best_static": ratio(rates[bp], rates["static_best"]),
            "vs_colocated": ratio(rates[bp], rates["colocated"]),
            "on_over_off": {k: {c: ratio(rates[k], off[k], c) for c in rates[k]} for k in rates},
            "carried_token_share": {k: v["carried_token_share"] for k, v in on.items()},
            "lost": {k: v["ledger"]["lost"] for k, v in on.items()},
            "duplicates": {k: v["ledger"]["duplicates"] for k, v in on.items()},
            # the bound for this setting (no over-sampling: a step still waits for its due
            # groups, so it is the non-clairvoyant bound) and each run's share of it
            "bound_nonclairvoyant_partial": bound,
            "fraction_of_nonclairvoyant_partial": {k: round(v["whole"] / bound, 4)
                                                   for k, v in rates.items()}}


def elastic_rate(recs: list[dict[str, Any]]) -> float | None:
    """``elastic.steady_rate`` of records in memory."""
    return rate_over(recs, list(range(1, len(recs))))


def plot(path: Path, rates: dict[str, dict[str, float | None]], nc: dict[str, float | None],
         labels: dict[str, str], note: str = "one sitting") -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    names = list(rates)
    cols = ("whole", "early", "late")
    width = 0.8 / len(cols)
    for j, (col, color) in enumerate(zip(cols, ("#555", "#69c", "#e73"), strict=True)):
        xs = [i + (j - 1) * width for i in range(len(names))]
        bars = ax.bar(xs, [rates[n].get(col) or 0.0 for n in names], width, color=color,
                      label=f"{col} run" if col == "whole" else f"{col} regime")
        ax.bar_label(bars, fmt="%.0f", fontsize=6)
        if nc.get(col):
            ax.axhline(nc[col], color=color, linestyle="--", linewidth=1,
                       label=f"non-clairvoyant bound ({col}; the file's costs)")
    ax.set_xticks(range(len(names)), [labels.get(n, n).replace("_", " ") for n in names],
                  fontsize=7)
    ax.set_ylabel("samples/s (steady)")
    ax.set_title("Drifting GenRM long-tail workload (responses 24 -> 96 tokens), real processes, "
                 f"2 workers ({note})")
    ax.legend(fontsize=7, ncols=2)
    fig.savefig(path, dpi=110)


def main(args: Any, argv: list[str]) -> int:
    """``args``: elastic.py's parsed arguments (``drift_steps``, ``workers``, ``out``,
    ``json``, ``no_adaptive``); ``argv`` the command line, for the JSON's ``command``."""
    out = args.out or Path(tempfile.mkdtemp(prefix="pivotflow-elastic-drift-"))
    out.mkdir(parents=True, exist_ok=True)
    WARM[:] = ["warm_roles=true"] if getattr(args, "warm_roles", False) else []
    staleness = getattr(args, "max_staleness", None)
    STALENESS[:] = [] if staleness is None else [staleness]
    steps, w, cores = args.drift_steps, args.workers, os.cpu_count() or 1
    reg = regimes(DRIFT, steps)
    runs: dict[str, dict[str, Any]] = {}
    runs["colocated"] = measure("colocated", out, "colocated", steps, w, [], reg)
    deployments = elastic.static_deployments(w)
    for name, sets in deployments.items():
        runs[name] = measure(name, out, "static", steps, None, sets, reg)
    static = {n: runs[n]["rates"] for n in deployments}

    def best(key: str) -> str:
        return max(static, key=lambda n: static[n][key] or static[n]["whole"])

    early_name, best_name = best("early"), best("whole")
    carried = [s for s in deployments[early_name] if not s.startswith("colocate=")]
    dropped = [s for s in deployments[early_name] if s.startswith("colocate=")]
    runs["backpressure_carried_over"] = measure("backpressure-carried", out, "backpressure",
                                                steps, None, carried, reg)
    default = started_sizes(w, "backpressure")
    sizes = {s.split("=")[0][len("pools."):]: int(s.split("=")[1]) for s in carried}
    if default == sizes:
        runs["backpressure"] = runs["backpressure_carried_over"]
    else:
        runs["backpressure"] = measure("backpressure", out, "backpressure", steps, w, [], reg)
    if not args.no_adaptive:
        runs["adaptive_carried_over"] = measure("adaptive-carried", out, "adaptive", steps,
                                                None, carried, reg)
    rates = {"colocated": runs["colocated"]["rates"], "static_early_tuned": static[early_name],
             "static_best": static[best_name], "backpressure": runs["backpressure"]["rates"],
             "backpressure_carried_over": runs["backpressure_carried_over"]["rates"]}
    if "adaptive_carried_over" in runs:
        rates["adaptive_carried_over"] = runs["adaptive_carried_over"]["rates"]
    partial = (with_partial(out, steps, w, reg, rates, deployments, early_name, best_name,
                            carried) if getattr(args, "partial", False) else None)
    b = bounds(steps, w, reg)
    sim = simulated(steps, w, reg, early_name, sizes, not args.no_adaptive)
    calib = {p: {c: None if r.get(c) is None or sim[p].get(c) is None
                 else round(sim[p][c] / r[c] - 1, 3) for c in r}
             for p, r in {**rates, **static}.items()}
    nc = {"whole": b["nonclairvoyant_bound"],
          **{k: (v or {}).get("nonclairvoyant_samples_per_s") for k, v in b["per_regime"].items()}}

    def ratio(a: str, c: str, col: str = "whole") -> float | None:
        x, y = rates[a].get(col), rates[c].get(col)
        return None if x is None or y is None else round(x / y, 4)

    def ratios(a: str) -> dict[str, Any]:
        return {col: {"over_early_static": ratio(a, "static_early_tuned", col),
                      "vs_best_static": ratio(a, "static_best", col),
                      "vs_colocated": ratio(a, "colocated", col)}
                for col in ("whole", *reg)}

    bp = "backpressure_carried_over"

    def got(col: str) -> str:  # the rate a bound is over ("steady": the whole run's)
        return "whole" if col == "steady" else col

    result = {
        "bench": "elastic", "mode": "drift", "workload": elastic.LONGTAIL.name,
        "warm_roles": bool(WARM),
        "max_staleness": STALENESS[0] if STALENESS else load_workload(str(DRIFT)).max_staleness,
        "schedule": str(DRIFT.relative_to(elastic.ROOT)), "steps": steps, "workers": w,
        "cores": cores, "oversubscribed": w > cores,
        "regimes": {k: [s + 1 for s in v] for k, v in reg.items()},  # 1-based metrics steps
        "regimes_note": "metrics steps (1-based) whose groups draw the schedule's early / late "
                        "flat lengths; step 1 (warm-up) is left out, as by steady_rate",
        # the keys bench/sim_paper.py --calibrate reads (whole-run steady rates)
        "samples_per_s": {k: v["whole"] for k, v in rates.items()},
        "samples_per_s_per_regime": rates,
        "static_splits": {n: r["whole"] for n, r in static.items()},
        "static_splits_per_regime": static,
        "static_early_tuned_split": early_name, "static_best_split": best_name,
        "carried_over_from": {"split": early_name, "sets": carried, "colocate_dropped": dropped,
                              "note": "backpressure takes no colocate= groups (pivotflow/"
                                      "config.py colocate_groups): started from the same pool "
                                      "sizes without them" if dropped else ""},
        "backpressure_start": default,
        "carried_over_over_early_static": ratio(bp, "static_early_tuned"),
        "vs_best_static": ratio(bp, "static_best"),
        "vs_colocated": ratio(bp, "colocated"),
        "ratios_per_regime": {p: ratios(p) for p in rates if p not in ("static_early_tuned",)},
        "bounds": b,
        "simulated": sim,
        "sim_error": calib,  # simulated / measured - 1, per run and regime
        "fraction_of_nonclairvoyant": {p: round(r["whole"] / nc["whole"], 4)
                                       for p, r in rates.items()},
        "fraction_of_nonclairvoyant_per_regime": {
            p: {c: None if not nc.get(c) or r.get(got(c)) is None else round(r[got(c)] / nc[c], 4)
                for c in nc} for p, r in rates.items()},
        "shifts": {n: r["shifts"] for n, r in runs.items()},
        "migrations": {n: r["migrations"] for n, r in runs.items()},
        "lost": {n: r["ledger"]["lost"] for n, r in runs.items()},
        "duplicates": {n: r["ledger"]["duplicates"] for n, r in runs.items()},
        "shift_latency_backpressure": elastic.shift_latency(runs[bp]["shift_records"]),
        "step_samples_per_s": {n: [round(x, 2) for x in r["step_samples_per_s"]]
                               for n, r in runs.items()},
        **({"partial_rollout": partial} if partial is not None else {}),
        "command": " ".join(["python", *argv]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "out": str(out),
    }
    png = out / "elastic_drift.png"
    short = {n: n.removeprefix("static-").replace("-", " | ") for n in static}
    plot(png, rates, nc, {"static_early_tuned": f"static tuned early\n{short[early_name]}",
                          "static_best": f"best static (hindsight)\n{short[best_name]}",
                          bp: "backpressure carried\nover from R/J/T "
                          + "/".join(str(sizes[p]) for p in elastic.POOLS),
                          "adaptive_carried_over": "adaptive carried over"})
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result) + "\n")
        shutil.copy(png, args.json.parent / png.name)
    print(json.dumps(result))
    return 0


def combine(files: list[Path]) -> dict[str, Any]:
    """Several ``--drift`` outputs (sequential sittings of a shared machine) as medians per run
    and regime, the baselines and ratios chosen again on the medians: backpressure "carried
    over" is the median of the backpressure runs that started from the median-early-tuned
    split's pool sizes (any run's ``backpressure`` or ``backpressure_carried_over``)."""
    import sim_paper  # a sibling script

    docs = [json.loads(Path(f).read_text().strip().splitlines()[-1]) for f in files]
    sim_paper.warm_of(docs, "--combine")  # (a mix of warm and cold runs is refused)
    cols = ("whole", "early", "late")

    def med(rows: list[dict[str, float | None]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for c in cols:
            xs = [r[c] for r in rows if r.get(c) is not None]
            out[c] = statistics.median(xs) if xs else None
            out[f"{c}_runs"] = [round(x, 2) for x in xs]
        return out

    def start_of(d: dict[str, Any], default: bool) -> str:
        sizes = d["backpressure_start"] if default else {
            s.split("=")[0][len("pools."):]: int(s.split("=")[1])
            for s in d["carried_over_from"]["sets"]}
        return "/".join(str(sizes[p]) for p in elastic.POOLS)

    static = {n: med([d["static_splits_per_regime"][n] for d in docs])
              for n in docs[0]["static_splits_per_regime"]}
    early = max(static, key=lambda n: static[n]["early"] or 0.0)
    best = max(static, key=lambda n: static[n]["whole"] or 0.0)
    by_start: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for d in docs:
        seen: set[tuple[str, str]] = set()
        for key in ("backpressure", "backpressure_carried_over", "adaptive_carried_over"):
            if key not in d["samples_per_s_per_regime"]:
                continue
            planner, start = key.split("_")[0], start_of(d, key == "backpressure")
            if (planner, start) in seen:  # the same run under two names
                continue
            seen.add((planner, start))
            by_start.setdefault(planner, {}).setdefault(start, []).append(
                d["samples_per_s_per_regime"][key])
    sizes = dict(item.split("=") for item in elastic.static_deployments(docs[0]["workers"])[early])
    carried = "/".join(sizes[f"pools.{p}"] for p in elastic.POOLS)
    rates = {"colocated": med([d["samples_per_s_per_regime"]["colocated"] for d in docs]),
             "static_early_tuned": static[early], "static_best": static[best]}
    for planner, starts in by_start.items():
        if carried in starts:
            rates[f"{planner}_carried_over"] = med(starts[carried])
    default = start_of(docs[0], True)
    if default != carried:  # backpressure as ``pivotflow run --workers N`` starts it
        rates["backpressure"] = med(by_start["backpressure"][default])
    nc = docs[0]["bounds"]["nonclairvoyant_bound"]
    reg_nc = {c: (docs[0]["bounds"]["per_regime"].get(c) or {}).get("nonclairvoyant_samples_per_s")
              for c in ("early", "late")}

    def ratio(a: str, b: str, c: str = "whole") -> float | None:
        x, y = rates.get(a, {}).get(c), rates[b].get(c)
        return None if x is None or y is None else round(x / y, 4)

    bp = "backpressure_carried_over"
    return {
        "bench": "elastic", "mode": "drift-combined", "runs": len(docs),
        "backpressure_start_R_J_T": default,
        "files": [str(f) for f in files], "static_early_tuned_split": early,
        "static_best_split": best, "carried_over_start_R_J_T": carried,
        "samples_per_s_per_regime": rates, "static_splits_per_regime": static,
        "backpressure_by_start_R_J_T": {pl: {s: med(v) for s, v in st.items()}
                                        for pl, st in by_start.items()},
        "carried_over_over_early_static": ratio(bp, "static_early_tuned"),
        "vs_best_static": ratio(bp, "static_best"), "vs_colocated": ratio(bp, "colocated"),
        "per_regime": {c: {"carried_over_over_early_static": ratio(bp, "static_early_tuned", c),
                           "vs_best_static": ratio(bp, "static_best", c),
                           "vs_colocated": ratio(bp, "colocated", c)} for c in cols},
        "nonclairvoyant_bound": nc, "nonclairvoyant_bound_per_regime": reg_nc,
        "fraction_of_nonclairvoyant": {p: round(r["whole"] / nc, 4) for p, r in rates.items()},
        "lost": sum(v for d in docs for v in d["lost"].values()),
        "duplicates": sum(v for d in docs for v in d["duplicates"].values()),
        "simulated": docs[0]["simulated"],
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def pairs(sitting: Path, reps: int, out: Path) -> dict[str, Any]:
    """The baselines of a ``--drift --partial`` output ``sitting`` again, partial rollouts off
    then on, ``reps`` times in turn (a pair runs back to back, so the host's drift over the
    sitting falls on both halves alike), each from its start in the sitting, at its staleness
    (the best static is left out where it is the early-tuned one)."""
    doc = json.loads(sitting.read_text().strip().splitlines()[-1])
    STALENESS[:] = [doc["max_staleness"]]
    WARM[:] = ["warm_roles=true"] if doc["warm_roles"] else []
    steps, w, carried = doc["steps"], doc["workers"], doc["carried_over_from"]["sets"]
    early, best = doc["static_early_tuned_split"], doc["static_best_split"]
    arms = partial_arms(w, elastic.static_deployments(w), early, best, carried,
                        "adaptive_carried_over" in doc["partial_rollout"]["on_over_off"])
    if best == early:
        del arms["static_best"]
    reg = regimes(DRIFT, steps)
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in arms}
    for rep in range(reps):
        for key, (planner, workers, sets) in arms.items():
            off, on = (measure(f"{key}-{tag}-{rep}", out, planner, steps, workers,
                               [*sets, *extra], reg)
                       for tag, extra in (("off", []), ("on", [PARTIAL])))
            rows[key].append({"off": off["rates"], "on": on["rates"],
                              "on_over_off": round(on["rates"]["whole"]
                                                   / off["rates"]["whole"], 4),
                              "shifts": [off["shifts"], on["shifts"]],
                              "migrations": [off["migrations"], on["migrations"]]})
    return {"bench": "elastic", "mode": "drift-partial-pairs", "sitting": str(sitting),
            "max_staleness": doc["max_staleness"], "steps": steps, "workers": w,
            "carried_over_from": carried, "pairs": rows,
            "on_over_off": {k: [r["on_over_off"] for r in v] for k, v in rows.items()},
            "on_over_off_median": {k: statistics.median(r["on_over_off"] for r in v)
                                   for k, v in rows.items()},
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": " ".join(["python", *sys.argv])}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="combine bench/elastic.py --drift outputs, or "
                                 "rerun a --partial sitting's baselines off/on in pairs")
    ap.add_argument("--combine", nargs="+", type=Path, default=None)
    ap.add_argument("--pairs", type=Path, default=None,
                    help="a --drift --partial output: its baselines, off then on")
    ap.add_argument("--reps", type=int, default=2, help="--pairs: rounds")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--png", type=Path, default=None, help="the medians' elastic_drift.png")
    a = ap.parse_args()
    if a.pairs is not None:
        got = pairs(a.pairs, a.reps, Path(tempfile.mkdtemp(prefix="pivotflow-partial-pairs-")))
        if a.json is not None:
            a.json.write_text(json.dumps(got, indent=1) + "\n")
        print(json.dumps(got))
        sys.exit(0)
    if not a.combine:
        ap.error("give --combine FILES or --pairs FILE")
    got = combine(a.combine)
    if a.png is not None:
        r = got["samples_per_s_per_regime"]
        short = {n: n.removeprefix("static-").replace("-", " | ")
                 for n in (got["static_early_tuned_split"], got["static_best_split"])}
        plot(a.png, {p: {c: v[c] for c in ("whole", "early", "late")} for p, v in r.items()},
             {"whole": got["nonclairvoyant_bound"], **got["nonclairvoyant_bound_per_regime"]},
             {"static_early_tuned": f"static tuned early\n{short[got['static_early_tuned_split']]}",
              "static_best": f"best static (hindsight)\n{short[got['static_best_split']]}",
              "backpressure_carried_over": "backpressure carried\nover from R/J/T "
              + got["carried_over_start_R_J_T"],
              "adaptive_carried_over": "adaptive carried\nover from R/J/T "
              + got["carried_over_start_R_J_T"],
              "backpressure": f"backpressure\nstarted R/J/T {got['backpressure_start_R_J_T']}"},
             f"median of {got['runs']} sittings")
    got["command"] = " ".join(["python", *sys.argv])
    if a.json is not None:
        a.json.write_text(json.dumps(got, indent=1) + "\n")
    print(json.dumps(got))
