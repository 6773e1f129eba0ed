"""Partial rollouts on vs off: in the simulator (the real controller in virtual time), or with
``--real`` on real worker processes (graphs/grpo_genrm.py), where RL must come out unchanged.

Simulated (the default): ``pivotflow sim`` takes no ``--set``, and the simulator builds its
controller's config itself (pivotflow/sim/cluster.py), so this bench hands it a config class
with ``partial_rollout`` set; nothing else of the simulation changes. For each setting:
samples/s in the steady state, the non-clairvoyant bound beside it (pivotflow/sim/fluid.py:
computed without partial rollouts, which it does not model), the share of trained tokens
sampled from a version older than the one a step trains, and the carry-overs and refusals.

    python bench/partial_rollout.py bench/workloads/dense7b_judge32b.toml --gpus 128 --steps 8

Real (``--real``): graphs/grpo_genrm.py through ``pivotflow.run.run`` (``live=false``, the
graph's own pools), for each seed (``--seeds``, default 0,1) in three settings at the same
``max_staleness`` (``--staleness``, default 1) and steps (default 200): off, on
(``partial_rollout=true``) and on with over-sampling (``partial_rollout=true over_sample=X``,
``--over``, default 0.5). Each run is one JSON line in ``--out`` (default
bench/results/partial_rollout_real.jsonl): task_accuracy over the first and last 20 steps and
per 20 steps, samples/s (the run summary's: samples trained over ``run_s``, the run's wall
time), the ledger, the cumulative ``tokens_generated``, ``carried_over`` and
``groups_refused``, and two token shares weighted by each step's trained tokens (samples x mean
response length) over the steps after the first (which fills the pipeline), as the simulated
mode weighs them: ``stale_token_share`` (from a version older than the one trained; pipelining
alone keeps it near 1 at max_staleness 1) and ``carried_token_share`` (generated before a step
boundary cut their response, so from an older version *within* one response — what partial
rollouts add). The curves (task_accuracy per step, raw and smoothed, one panel per seed, and
on minus off smoothed) go to ``--png`` (default bench/results/partial_rollout_real_accuracy.png).

The noise figure: two runs of one setting and seed differ only through timing (which policy
version generated which group), so a repeat of off says little (off, seed 0: last-20 0.6055
in two sittings, 0.6031 in a third); the noise is the seed-to-seed spread of off's last-20
accuracy (max minus min over the seeds; a seed changes the problems and the sampling, and the
built-in models stay those of ``--models-seed``), beside the binomial standard error of a
difference of two last-20 accuracies (sqrt(2 p (1 - p) / n), n the samples trained in 20
steps; samples of a group share a prompt, so it is a lower bound). A setting is within noise
when, at every seed, |on - off| of the last-20 accuracy is at most the larger of the two. The
last line is one JSON object with those figures; samples/s on the shared 2-core machine moves
by 2x between sittings, so it is reported, not judged.

    python bench/partial_rollout.py --real [--steps 200] [--seeds 0,1] [--over 0.5]

(``--plot-only`` draws the PNG and prints the last line again from ``--out``, without runs.)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GRAPH = "graphs/grpo_genrm.py"
REAL_OUT = ROOT / "bench" / "results" / "partial_rollout_real.jsonl"
REAL_PNG = ROOT / "bench" / "results" / "partial_rollout_real_accuracy.png"
WINDOW = 20  # steps per accuracy window (first20, last20, per20)
COLORS = {"off": "tab:blue", "on": "tab:orange", "over": "tab:green"}


def token_weighted(recs: list[dict[str, Any]], key: str) -> float:
    """``key`` (a share of a step's trained tokens) over the steps after the first (which fills
    the pipeline), each weighted by its trained tokens (samples x mean response length)."""
    recs = recs[1:] or recs
    tokens = [(r.get("samples") or 0) * (r.get("response_len_mean") or 0) for r in recs]
    total = sum(t * (r.get(key) or 0.0) for t, r in zip(tokens, recs, strict=True))
    return round(total / max(sum(tokens), 1e-9), 4)


def run(wl: Any, split: Any, planner: str, steps: int, partial: bool,
        over: float = 0.0) -> dict[str, Any]:
    import pivotflow.sim.cluster as cluster
    from pivotflow.controller.core import ControllerConfig
    from pivotflow.sim.cluster import simulate

    cluster.ControllerConfig = functools.partial(  # type: ignore[misc,assignment]
        ControllerConfig, partial_rollout=partial, over_sample=over)
    try:
        res = simulate(wl, planner, split, steps=steps, wall_limit_s=1800.0)
    finally:
        cluster.ControllerConfig = ControllerConfig  # type: ignore[misc]
    recs = res.records[1:] or res.records  # the first step fills the pipeline
    last = res.records[-1] if res.records else {}
    return {"samples_per_s": round(res.samples_per_s, 3), "sim_s": round(res.sim_s, 1),
            "wall_s": round(res.wall_s, 1), "timed_out": res.timed_out,
            "stale_token_share": token_weighted(res.records, "stale_token_share"),
            "carried_token_share": token_weighted(res.records, "carried_token_share"),
            "staleness_max": max(r["staleness_max"] for r in recs),
            "carried_over": last.get("carried_over", 0),
            "groups_refused": last.get("groups_refused", 0),
            "tokens_refused": last.get("tokens_refused", 0),
            "tokens_generated": res.tokens_generated}


def simulated(args: argparse.Namespace) -> None:
    from pivotflow.sim.cluster import Split
    from pivotflow.sim.fluid import fluid_bound, rank_splits
    from pivotflow.sim.workload import load_workload

    wl = load_workload(args.workload)
    if args.gpus:
        wl = wl.scaled(args.gpus)
    if args.staleness is not None:
        wl = dataclasses.replace(wl, max_staleness=args.staleness)
    steps = 8 if args.steps is None else args.steps
    split = Split(**rank_splits(wl, top=1)[0][1])
    off = run(wl, split, args.planner, steps, False)
    on = run(wl, split, args.planner, steps, True)
    overs = [0.25, 0.5] if args.over is None else args.over
    over = {str(x): run(wl, split, args.planner, steps, True, x) for x in overs}
    nc = fluid_bound(wl)["nonclairvoyant_samples_per_s"]
    for r in (off, on, *over.values()):
        r["fraction_of_nonclairvoyant"] = round(r["samples_per_s"] / nc, 4)
        r["over_off"] = round(r["samples_per_s"] / off["samples_per_s"], 4)
    print(json.dumps({"workload": wl.name, "gpus": wl.gpus, "planner": args.planner,
                      "max_staleness": wl.max_staleness, "steps": steps,
                      "split": split.as_dict(), "nonclairvoyant_bound": round(nc, 3),
                      "off": off, "on": on, "on_over_sample": over,
                      "on_over_off": round(on["samples_per_s"] / off["samples_per_s"], 4)}))


# ---- real processes ---------------------------------------------------------------------------


def accuracies(recs: list[dict[str, Any]]) -> list[float]:
    """task_accuracy per step (NaN where a step has none)."""
    out = []
    for r in recs:
        v = r.get("task_accuracy")
        out.append(float(v) if isinstance(v, (int, float)) else math.nan)
    return out


def window_mean(values: list[float]) -> float | None:
    kept = [v for v in values if not math.isnan(v)]
    return round(statistics.mean(kept), 4) if kept else None


def settings(over: list[float]) -> list[tuple[str, list[str]]]:
    """(name, --set items) of each real setting: off, on, and on with each over_sample."""
    out: list[tuple[str, list[str]]] = [("off", []), ("on", ["partial_rollout=true"])]
    for i, x in enumerate(over):
        out.append(("over" if len(over) == 1 else f"over{i}",
                    ["partial_rollout=true", f"over_sample={x}"]))
    return out


def watch_steps(path: Path, update: Any, done: threading.Event) -> None:
    """Report the steps metrics.jsonl holds until ``done`` (for the progress bar)."""
    while not done.wait(0.5):
        with contextlib.suppress(OSError):
            update(path.read_bytes().count(b"\n"))


def real_run(name: str, items: list[str], seed: int, steps: int, staleness: int,
             extra: list[str], out: Path, models_seed: int | None = 0, progress: Any = None,
             task: Any = None) -> tuple[dict[str, Any], list[float]]:
    """One run of the GenRM graph; its JSON line and its task_accuracy per step."""
    from pivotflow.metrics import read_metrics
    from pivotflow.run import run as run_graph

    # the built-in models of ``models_seed`` whatever the RL seed (None: the run's own seed,
    # bootstrapping them once per seed: ~20 min each on 2 cores)
    pinned = [] if models_seed is None else [f"models_seed={models_seed}"]
    sets = ["live=false", f"max_staleness={staleness}", f"seed={seed}", *pinned, *items, *extra]
    done = threading.Event()
    if progress is not None:
        progress.reset(task, total=steps, description=f"{name}, seed {seed}")
        watcher = threading.Thread(target=watch_steps, daemon=True, args=(
            out / "metrics.jsonl", lambda n: progress.update(task, completed=n), done))
        watcher.start()
    try:
        result = run_graph(ROOT / GRAPH, sets=sets, out=out, steps=steps, console=False)
    finally:
        done.set()
    recs = read_metrics(out / "metrics.jsonl")
    acc = accuracies(recs)
    s, last = result.summary, recs[-1] if recs else {}
    line = {"run": f"{name}{seed}", "graph": GRAPH, "steps": len(recs),
            "max_staleness": staleness, "setting": " ".join(items + extra), "seed": seed,
            "task_accuracy_first20": window_mean(acc[:WINDOW]),
            "task_accuracy_last20": window_mean(acc[-WINDOW:]),
            "task_accuracy_per20": [window_mean(acc[i:i + WINDOW])
                                    for i in range(0, len(acc), WINDOW)],
            "run_s": round(s["wall_s"], 1), "samples_per_s": round(s["samples_per_s"], 1),
            "stale_token_share": token_weighted(recs, "stale_token_share"),
            "carried_token_share": token_weighted(recs, "carried_token_share"),
            "tokens_generated": last.get("tokens_generated", 0),
            "carried_over": last.get("carried_over", 0),
            "groups_refused": last.get("groups_refused", 0),
            "tokens_refused": last.get("tokens_refused", 0),
            "samples_per_step": round(statistics.mean(r.get("samples", 0) for r in recs), 2)
            if recs else 0,
            "ledger": s["ledger"],
            "task_accuracy_per_step": [None if math.isnan(a) else round(a, 4) for a in acc]}
    return line, acc


def summarise(by: dict[tuple[str, int], dict[str, Any]], names: list[str], seeds: list[int],
              steps: int, staleness: int) -> dict[str, Any]:
    """The last line: last-20 accuracy per setting and seed, on minus off, and the noise
    (``by``: each run's line by setting name and seed)."""
    last = {n: [by[n, s]["task_accuracy_last20"] for s in seeds] for n in names}
    off = last["off"]
    spread = round(max(off) - min(off), 4) if len(off) > 1 else None
    p = statistics.mean(off)
    n = WINDOW * statistics.mean(by["off", s]["samples_per_step"] for s in seeds)
    se = round(math.sqrt(2 * p * (1 - p) / n), 4) if n else None
    noise = max(x for x in (spread, se) if x is not None) if (spread, se) != (None, None) \
        else None
    diff = {n_: [round(a - b, 4) for a, b in zip(last[n_], off, strict=True)]
            for n_ in names if n_ != "off"}

    def mean_of(key: str, name: str) -> float:
        return round(statistics.mean(by[name, s][key] for s in seeds), 4)

    return {"bench": "partial_rollout_real", "graph": GRAPH, "steps": steps,
            "max_staleness": staleness, "seeds": seeds,
            "settings": {n_: by[n_, seeds[0]]["setting"] for n_ in names},
            "task_accuracy_last20": last,
            "task_accuracy_last20_mean": {n_: round(statistics.mean(v), 4)
                                          for n_, v in last.items()},
            "on_minus_off_last20": diff,
            "noise_off_seed_spread_last20": spread, "binomial_se_diff_last20": se,
            "noise_last20": noise,
            "within_noise": {n_: noise is not None and all(abs(d) <= noise for d in v)
                             for n_, v in diff.items()},
            "carried_token_share": {n_: mean_of("carried_token_share", n_) for n_ in names},
            "stale_token_share": {n_: mean_of("stale_token_share", n_) for n_ in names},
            "carried_over": {n_: mean_of("carried_over", n_) for n_ in names},
            "groups_refused": {n_: mean_of("groups_refused", n_) for n_ in names},
            "samples_per_s": {n_: round(mean_of("samples_per_s", n_), 1) for n_ in names},
            "samples_per_s_over_off": {n_: round(mean_of("samples_per_s", n_)
                                                 / mean_of("samples_per_s", "off"), 3)
                                       for n_ in names}}


def plot(curves: dict[tuple[str, int], list[float]], names: list[str], seeds: list[int],
         summary: dict[str, Any], path: Path) -> None:
    """task_accuracy per step per setting, raw (thin) and smoothed, one panel per seed; below,
    each setting's smoothed accuracy minus off's, with off's seed-to-seed difference beside."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from pivotflow.metrics_plots import ema, smoothing_span

    fig = Figure(figsize=(10, 3.2 * (len(seeds) + 1)), layout="constrained")
    axes = fig.subplots(len(seeds) + 1, 1, sharex=True)
    every = [a for v in curves.values() for a in v if not math.isnan(a)]
    n = max(len(v) for v in curves.values())
    span = smoothing_span(n)
    smooth = {k: ema(v, span) for k, v in curves.items()}
    for ax, seed in zip(axes, seeds, strict=False):
        for i, name in enumerate(names):
            acc = curves[name, seed]
            color = COLORS.get(name, f"C{i}")
            steps = list(range(1, len(acc) + 1))
            ax.plot(steps, acc, linewidth=0.6, alpha=0.35, color=color)
            ax.plot(steps, smooth[name, seed], linewidth=2.0, color=color,
                    linestyle=("-", "--", ":")[i % 3],
                    label=f"{name}: {summary['settings'][name] or 'partial_rollout=false'}")
        ax.set_ylabel(f"task accuracy, seed {seed}")
        ax.set_ylim(min(every, default=0.0) - 0.02, max(every, default=1.0) + 0.02)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
                   title=f"thin: per step, thick: EMA ({span} steps)", title_fontsize="small")
    ax = axes[-1]
    base = seeds[0]
    for i, name in enumerate(names[1:], start=1):
        for seed, style in zip(seeds, ("-", "--", ":", "-."), strict=False):
            d = [a - b for a, b in zip(smooth[name, seed], smooth["off", seed], strict=False)]
            ax.plot(range(1, len(d) + 1), d, color=COLORS.get(name, f"C{i}"),
                    linestyle=style, linewidth=1.5, label=f"{name} - off, seed {seed}")
    for seed in seeds[1:]:
        d = [a - b for a, b in zip(smooth["off", seed], smooth["off", base], strict=False)]
        ax.plot(range(1, len(d) + 1), d, color="gray", linewidth=1.5,
                label=f"off seed {seed} - off seed {base} (noise)")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_ylabel("smoothed accuracy\ndifference")
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    share = ", ".join(f"{k} {v:.3f}" for k, v in summary["carried_token_share"].items())
    axes[0].set_title(f"grpo_genrm, {summary['steps']} steps, max_staleness "
                      f"{summary['max_staleness']}: partial rollouts vs off\n"
                      f"carried_token_share {share}", fontsize="medium")
    FigureCanvasAgg(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def real(args: argparse.Namespace) -> dict[str, Any]:
    from rich import progress as rp
    from rich.console import Console

    steps = 200 if args.steps is None else args.steps
    staleness = 1 if args.staleness is None else args.staleness
    seeds = [int(s) for s in args.seeds.split(",")]
    models_seed = None if args.models_seed < 0 else args.models_seed
    plan = settings([0.5] if args.over is None else args.over)
    names = [n for n, _ in plan]
    lines: dict[tuple[str, int], dict[str, Any]] = {}
    curves: dict[tuple[str, int], list[float]] = {}
    console = Console(stderr=True)
    columns = (rp.TextColumn("{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(),
               rp.TimeElapsedColumn())
    with tempfile.TemporaryDirectory(prefix="pivotflow-partial-") as tmp, \
            rp.Progress(*columns, console=console, disable=args.quiet) as progress:
        runs = progress.add_task("runs", total=len(seeds) * len(plan))
        step_task = progress.add_task("steps", total=steps)
        for seed in seeds:
            for name, items in plan:
                t0 = time.perf_counter()
                line, acc = real_run(name, items, seed, steps, staleness, args.set,
                                     Path(tmp) / f"{name}{seed}", models_seed, progress,
                                     step_task)
                lines[name, seed] = line
                curves[name, seed] = acc
                progress.advance(runs)
                progress.console.print(
                    f"{line['run']}: accuracy {line['task_accuracy_first20']} -> "
                    f"{line['task_accuracy_last20']}, {line['samples_per_s']} samples/s, "
                    f"carried_token_share {line['carried_token_share']}, carried_over "
                    f"{line['carried_over']}, refused {line['groups_refused']} "
                    f"({time.perf_counter() - t0:.0f} s)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(ln) + "\n" for ln in lines.values()))
    return finish(lines, curves, names, seeds, args)


def replot(args: argparse.Namespace) -> dict[str, Any]:
    """``--plot-only``: the summary and the PNG again from ``--out``'s lines (no runs)."""
    lines: dict[tuple[str, int], dict[str, Any]] = {}
    for text in args.out.read_text().splitlines():
        ln = json.loads(text)
        lines[ln["run"][:-len(str(ln["seed"]))], ln["seed"]] = ln
    curves = {k: [math.nan if a is None else a for a in ln["task_accuracy_per_step"]]
              for k, ln in lines.items()}
    names = list(dict.fromkeys(n for n, _ in lines))
    seeds = list(dict.fromkeys(s for _, s in lines))
    return finish(lines, curves, names, seeds, args)


def finish(lines: dict[tuple[str, int], dict[str, Any]],
           curves: dict[tuple[str, int], list[float]], names: list[str], seeds: list[int],
           args: argparse.Namespace) -> dict[str, Any]:
    """Summarise, draw the PNG and print the last line."""
    first = next(iter(lines.values()))
    summary = summarise(lines, names, seeds, first["steps"], first["max_staleness"])
    plot(curves, names, seeds, summary, args.png)
    summary["out"] = str(args.out)
    summary["png"] = str(args.png)
    print(json.dumps(summary))
    return summary


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workload", type=Path, nargs="?", help="simulated mode: the workload file")
    p.add_argument("--gpus", type=int, default=None)
    p.add_argument("--steps", type=int, default=None, help="default 8 (simulated), 200 (real)")
    p.add_argument("--planner", default="backpressure")
    p.add_argument("--staleness", type=int, default=None,
                   help="replace the file's (simulated); default 1 (real)")
    p.add_argument("--over", type=float, nargs="*", default=None,
                   help="over_sample values to run with partial rollouts on "
                        "(default 0.25 0.5 simulated, 0.5 real)")
    p.add_argument("--real", action="store_true",
                   help="run graphs/grpo_genrm.py on real processes instead of simulating")
    p.add_argument("--seeds", default="0,1", help="real: comma-separated seeds")
    p.add_argument("--models-seed", type=int, default=0,
                   help="real: the built-in models' bootstrap seed for every run, so --seeds "
                        "varies the RL only (problems, sampling); -1: each run's own seed")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="real: one more --set for every run (repeatable)")
    p.add_argument("--out", type=Path, default=REAL_OUT, help="real: the per-run JSON lines")
    p.add_argument("--png", type=Path, default=REAL_PNG, help="real: the accuracy curves")
    p.add_argument("--quiet", action="store_true", help="real: no progress display")
    p.add_argument("--plot-only", action="store_true",
                   help="real: no runs; the summary and --png again from --out's lines")
    args = p.parse_args(argv)
    if args.plot_only:
        replot(args)
    elif args.real:
        real(args)
    elif args.workload is None:
        p.error("a workload file is needed (or --real)")
    else:
        simulated(args)


if __name__ == "__main__":
    main()
