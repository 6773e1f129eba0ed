"""PPO with a learned critic (``graphs/ppo_genrm.py``) against GRPO (``graphs/grpo_genrm.py``) on
the main job: the same task, judge, policy, learning rate and samples a step (64), real
processes, ``--steps`` steps a run, for each seed. Variants:

* ``grpo``: 8 prompts x 8 samples, advantages normalised within each prompt's group;
* ``ppo``: 64 prompts x 1 sample, GAE on the critic's values (its defaults: gamma = lam = 1,
  whitened over the batch, critic at ``graph.critic_lr``);
* ``ppo_g8``: PPO on grpo's 8 x 8 batches, so that the advantage estimator is the only change;
* with ``--variants``, also grpo_genrm's other estimators on its 8 x 8 batches (``rloo``,
  ``grpo_no_std``, ``grpo_batch_std``, ``reinforce_pp``, ``reinforce_pp_baseline``:
  ``graph.estimator``), and
  four optimizer updates a step (``grpo_mb4``, ``ppo_mb4``: ``graph.mini_batches=4``).

The variants alternate within each seed, so a machine that slows down mid-sitting weighs on
each alike. samples/s is each graph's own deployment: PPO runs one more worker (the critic's
pool) on the same cores. Each run's line (with its command) goes to ``--out`` as JSON lines;
the last line printed is one JSON object with the means and ratios.

    python bench/ppo_real.py [--steps 200] [--seeds 0,1] [--variants grpo,ppo,ppo_g8] \
        [--out bench/results/ppo_real.jsonl] [--plot bench/results/ppo_real_accuracy.png]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from graph_runs import command, run_graph  # noqa: E402 - a sibling file, not a package

VARIANTS = {
    "grpo": ("graphs/grpo_genrm.py", []),
    "ppo": ("graphs/ppo_genrm.py", []),
    "ppo_g8": ("graphs/ppo_genrm.py", ["graph.group_size=8", "graph.groups_per_step=8"]),
    **{e: ("graphs/grpo_genrm.py", [f"graph.estimator={e}"])
       for e in ("rloo", "grpo_no_std", "grpo_batch_std", "reinforce_pp",
                 "reinforce_pp_baseline")},
    # four optimizer updates a step (verl's ppo_mini_batch_size = a quarter of the batch)
    "grpo_mb4": ("graphs/grpo_genrm.py", ["graph.mini_batches=4"]),
    "ppo_mb4": ("graphs/ppo_genrm.py", ["graph.mini_batches=4"]),
}
DEFAULT_VARIANTS = "grpo,ppo,ppo_g8"


def one_run(variant: str, seed: int, steps: int) -> dict[str, Any]:
    graph, sets = VARIANTS[variant]
    sets = ["live=false", f"seed={seed}", "models_seed=0", *sets]
    summary, steps_rec = run_graph(graph, steps, sets)
    last = steps_rec[-max(5, len(steps_rec) // 10):]  # the critic's figures at the end
    critic = {k: statistics.mean(r[k] for r in last)
              for k in ("train_value_mean", "train_return_mean", "train_value_error")
              if k in last[0]}
    return {"bench": "ppo_real", "date": datetime.date.today().isoformat(), "variant": variant,
            "command": command(graph, steps, sets),
            "seed": seed, "steps": steps,
            "task_accuracy_start": summary["task_accuracy_start"],
            "task_accuracy_end": summary["task_accuracy_end"],
            "samples_per_s": summary["samples_per_s"], "wall_s": summary["wall_s"],
            **{f"{k}_last_tenth": v for k, v in critic.items()},
            "task_accuracy_by_step": [r.get("task_accuracy") for r in steps_rec]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"of {','.join(VARIANTS)}")
    ap.add_argument("--out", type=Path, default=None, help="append each run's line here")
    ap.add_argument("--plot", type=Path, default=None,
                    help="draw each variant's accuracy per step (PNG), one panel per seed")
    args = ap.parse_args()
    variants = args.variants.split(",")
    runs = []
    for i, seed in enumerate(int(s) for s in args.seeds.split(",")):
        order = variants if i % 2 == 0 else variants[::-1]
        for v in order:
            line = one_run(v, seed, args.steps)
            print(json.dumps(line), file=sys.stderr, flush=True)
            runs.append(line)
            if args.out is not None:
                with args.out.open("a") as f:
                    f.write(json.dumps(line) + "\n")
    out: dict[str, Any] = {"bench": "ppo_real", "steps": args.steps, "seeds": args.seeds}
    for v in variants:
        mine = [r for r in runs if r["variant"] == v]
        out[f"{v}_accuracy_end"] = statistics.mean(r["task_accuracy_end"] for r in mine)
        out[f"{v}_accuracy_gain"] = statistics.mean(
            r["task_accuracy_end"] - r["task_accuracy_start"] for r in mine)
        out[f"{v}_samples_per_s"] = statistics.mean(r["samples_per_s"] for r in mine)
    if "grpo" in variants:
        for v in variants:
            if v != "grpo":
                out[f"{v}_over_grpo_samples_per_s"] = (out[f"{v}_samples_per_s"]
                                                       / out["grpo_samples_per_s"])
    if args.plot is not None:
        plot(runs, variants, args.plot)
    print(json.dumps(out))


def plot(runs: list[dict[str, Any]], variants: list[str], path: Path) -> None:
    """task_accuracy per step of each variant, raw (thin) and smoothed, one panel per seed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from pivotflow.metrics_plots import ema, smoothing_span

    seeds = sorted({r["seed"] for r in runs})
    fig = Figure(figsize=(9, 3.2 * len(seeds)), layout="constrained")
    axes = fig.subplots(len(seeds), 1, sharex=True, squeeze=False)[:, 0]
    for ax, seed in zip(axes, seeds, strict=True):
        for i, v in enumerate(variants):
            run = next(r for r in runs if r["variant"] == v and r["seed"] == seed)
            acc = [math.nan if a is None else a for a in run["task_accuracy_by_step"]]
            steps = list(range(1, len(acc) + 1))
            ax.plot(steps, acc, linewidth=0.6, alpha=0.3, color=f"C{i}")
            ax.plot(steps, ema(acc, smoothing_span(len(acc))), linewidth=2.0, color=f"C{i}",
                    label=f"{v} ({run['samples_per_s']:.0f} samples/s)")
        ax.set_ylabel(f"task accuracy, seed {seed}")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
    axes[-1].set_xlabel("step")
    FigureCanvasAgg(fig).print_png(str(path))


if __name__ == "__main__":
    main()
