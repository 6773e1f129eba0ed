"""PNG plots of a run, drawn from its metrics.jsonl (and flow.jsonl, config.json beside it).

* ``reward_accuracy.png``: reward mean and task accuracy per step, each raw (thin, dots) with a
  smoothed line beside it (an exponential moving average, debiased at the start), and the
  evaluation rounds' held-out accuracy where the run has eval.jsonl.
* ``kl_ref.png`` (only when the graph has a reference stage): the KL to the reference model
  per step (``train_kl_ref``), raw and smoothed, as reward is.
* ``response_lengths.png`` (runs whose records carry ``response_len_max``): the mean and the
  longest response per step, and the share the length limit cut (``response_clip_ratio``) on
  a second axis: how far responses grow over a run, and when the cap starts to bind.
* ``entropy_clip.png`` (runs whose records carry ``train_entropy``): the policy's entropy per
  step, raw and smoothed, above the share of tokens the ratio clip held below and above: the
  pair that shows entropy collapse (falling entropy, clipping mostly above) and what
  clip-higher or an entropy bonus does to it.
* ``field_means.png`` (runs whose records carry ``field_means`` or ``logged_metrics``): the
  step's mean of each number the graph's own map and group stages write (each TRL reward
  function's reward, a verl ``compute_score``'s other keys) and of each name its code logged
  with ``log_metric``, raw and smoothed, one colour a series: which part of a summed reward
  moved.
* ``pools_queues.png``: workers per pool, queue depth per edge and (from flow.jsonl) jobs in
  flight per stage over time, each shift marked by a dashed line. The queues come from
  flow.jsonl's samples over time when the run has one (``pivotflow.flow_samples``), else from
  the step ends in metrics.jsonl. Pools are step lines, each a little offset from the next, so
  pools of the same size do not hide each other; the legend names each pool's size range.
* ``step_path.png`` (runs whose records carry each step's path, docs/records.md): one row per
  step over time, from its last group's admission through each served stage's last sample, the
  wait for the trainers, to its optimizer step's end: the pipeline's overlap, and which part of
  a slow step was long (the generation's tail, the judge, the trainers).

A resumed run is one run here: its steps and time_s continue (a run from before time_s
continued, whose time restarted at a resume, is put back on one axis), its shift times are
placed in the run's time, and each resume is marked by a dotted red line.

Plotting must never fail a run: any error is logged as a warning and the files written so far are
returned. matplotlib is imported here, lazily, and only its object API with the Agg canvas is used
(no pyplot), so no global backend is switched and no window can open.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pivotflow.controller.records import path_points
from pivotflow.flow_samples import read_flow
from pivotflow.metrics import read_metrics
from pivotflow.metrics_timeline import (
    Timeline,
    continuous_times,
    float_or_nan,
    flow_timeline,
    placed_shifts,
    pool_timeline,
    read_history,
    resume_points,
)

log = logging.getLogger(__name__)

REWARD_ACCURACY_PNG = "reward_accuracy.png"
POOLS_QUEUES_PNG = "pools_queues.png"
KL_REF_PNG = "kl_ref.png"
RESPONSE_LENGTHS_PNG = "response_lengths.png"
ENTROPY_CLIP_PNG = "entropy_clip.png"
FIELD_MEANS_PNG = "field_means.png"
STEP_PATH_PNG = "step_path.png"
STEP_PATH_ROWS = 400  # the newest steps drawn: more rows than pixels say nothing
POOL_OFFSET = 0.1  # workers between pool lines of the same size (less than the integer ticks)
RESUME_STYLE = {"color": "tab:red", "linestyle": ":", "linewidth": 1.2}


def _series(records: list[dict[str, Any]], key: str) -> dict[str, list[float]]:
    """``{name: values}`` of a ``{name: number}`` field, aligned to records (missing -> NaN)."""
    names: list[str] = []
    for r in records:
        for name in r.get(key) or {}:
            if name not in names:
                names.append(name)
    return {n: [float_or_nan((r.get(key) or {}).get(n)) for r in records] for n in names}


def ema(values: list[float], span: float) -> list[float]:
    """Exponential moving average over ``span`` points (weight 2 / (span + 1) on the newest),
    divided by the weight seen so far so the first points are not pulled to 0; a NaN (a step
    without the value) keeps the average as it is, NaN until the first value."""
    alpha = 2.0 / (span + 1.0)
    out: list[float] = []
    mean = weight = 0.0
    for v in values:
        if not math.isnan(v):
            mean = (1 - alpha) * mean + alpha * v
            weight = (1 - alpha) * weight + alpha
        out.append(mean / weight if weight > 0 else math.nan)
    return out


def smoothing_span(n: int) -> int:
    """Points the smoothed line averages over: a tenth of the run, within [2, 50]."""
    return max(2, min(50, round(n / 10)))


def _save(fig: Any, path: Path) -> None:
    """Save a figure next to its final name, then rename, so a half-written PNG never shows."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, path)


def _raw_and_smoothed(ax: Any, steps: list[float], values: list[float], label: str,
                      color: str, span: int) -> None:
    ax.plot(steps, values, marker=".", markersize=3, linewidth=0.7, alpha=0.4, color=color,
            label=f"{label} (per step)")
    ax.plot(steps, ema(values, span), linewidth=2.0, color=color,
            label=f"{label} (EMA, {span} steps)")


def _mark_resumes(ax: Any, xs: list[float]) -> None:
    for i, x in enumerate(xs):
        ax.axvline(x, **RESUME_STYLE, label="resumed" if i == 0 else None)


def _finish_per_step(fig: Any, ax: Any, path: Path, resumes: list[tuple[int, float]],
                     ylabel: str, title: str) -> None:
    """A one-axis plot over steps: the resumes marked, labels, legend and grid; saved."""
    _mark_resumes(ax, [float(s) for s, _ in resumes])
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.legend(loc="best", fontsize="small")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    _save(fig, path)


def _reward_accuracy(records: list[dict[str, Any]], path: Path,
                     resumes: list[tuple[int, float]],
                     rounds: Sequence[dict[str, Any]] = ()) -> None:
    from matplotlib.figure import Figure

    steps = [float_or_nan(r.get("step")) for r in records]
    span = smoothing_span(len(records))
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    _raw_and_smoothed(ax, steps, [float_or_nan(r.get("reward_mean")) for r in records],
                      "reward mean", "tab:blue", span)
    ax.set_xlabel("step")
    ax.set_ylabel("reward mean")
    _mark_resumes(ax, [float(s) for s, _ in resumes])
    handles = ax
    accuracy = [float_or_nan(r.get("task_accuracy")) for r in records]
    held_out = [(float(r["step"]), float_or_nan(r.get("task_accuracy"))) for r in rounds]
    if any(not math.isnan(a) for a in accuracy + [a for _, a in held_out]):
        ax2 = ax.twinx()
        _raw_and_smoothed(ax2, steps, accuracy, "task accuracy", "tab:green", span)
        if held_out:  # eval.jsonl: the rounds on held-out prompts
            n = max(int(r.get("samples_per_prompt") or 1) for r in rounds)
            ax2.plot([s for s, _ in held_out], [a for _, a in held_out], marker="D",
                     markersize=5, linewidth=1.2, color="tab:red",
                     label="held-out accuracy (evaluation rounds" +
                     (f", mean@{n})" if n > 1 else ")"))
            if n > 1:  # eval_samples: whether one of a prompt's n samples was right
                ax2.plot([float(r["step"]) for r in rounds],
                         [float_or_nan(r.get("task_pass_at_n")) for r in rounds], marker="^",
                         markersize=5, linewidth=1.0, linestyle="--", color="tab:purple",
                         label=f"held-out pass@{n}")
        ax2.set_ylabel("task accuracy")
        ax2.set_ylim(-0.02, 1.02)
        handles = ax2
    lines, labels = ax.get_legend_handles_labels()
    if handles is not ax:
        more = handles.get_legend_handles_labels()
        lines, labels = lines + more[0], labels + more[1]
    ax.legend(lines, labels, loc="best", fontsize="small")
    ax.set_title("reward and accuracy per step")
    ax.grid(alpha=0.3)
    _save(fig, path)


def _kl_ref(records: list[dict[str, Any]], path: Path, resumes: list[tuple[int, float]]) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    _raw_and_smoothed(ax, [float_or_nan(r.get("step")) for r in records],
                      [float_or_nan(r.get("train_kl_ref")) for r in records], "KL to the reference",
                      "tab:purple", smoothing_span(len(records)))
    _finish_per_step(fig, ax, path, resumes, "KL(policy || reference), nats per token",
                     "KL to the reference model per step")


def _entropy_clip(records: list[dict[str, Any]], path: Path,
                  resumes: list[tuple[int, float]]) -> None:
    from matplotlib.figure import Figure

    steps = [float_or_nan(r.get("step")) for r in records]
    span = smoothing_span(len(records))
    fig = Figure(figsize=(8, 6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    _raw_and_smoothed(top, steps, [float_or_nan(r.get("train_entropy")) for r in records],
                      "entropy", "tab:purple", span)
    top.set_ylabel("nats per token")
    top.set_title("the policy's entropy and the ratio clip per step")
    for key, label, color in (("train_clip_frac_low", "clipped below", "tab:blue"),
                              ("train_clip_frac_high", "clipped above", "tab:red")):
        bottom.plot(steps, [float_or_nan(r.get(key)) for r in records], marker=".", markersize=3,
                    linewidth=0.8, color=color, label=label)
    bottom.set_ylabel("share of trained tokens")
    bottom.set_xlabel("step")
    for ax in (top, bottom):
        _mark_resumes(ax, [float(s) for s, _ in resumes])
        ax.legend(loc="best", fontsize="small")
        ax.grid(alpha=0.3)
    _save(fig, path)


def _field_means(records: list[dict[str, Any]], path: Path,
                 resumes: list[tuple[int, float]]) -> None:
    from matplotlib.figure import Figure

    series = [(key, name, name if key == "field_means" else f"{name} (log_metric)")
              for key in ("field_means", "logged_metrics")
              for name in sorted({k for r in records for k in (r.get(key) or {})})]
    steps = [float_or_nan(r.get("step")) for r in records]
    span = smoothing_span(len(records))
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for i, (key, name, label) in enumerate(series):
        # a step where the field held no number (a None reward throughout) is a gap
        _raw_and_smoothed(ax, steps, [float_or_nan((r.get(key) or {}).get(name))
                                      for r in records], label, f"C{i % 10}", span)
    _finish_per_step(fig, ax, path, resumes, "mean over the step's samples",
                     "the graph's own fields per step (field_means)")


def plot_response_lengths(records: list[dict[str, Any]], path: Path,
                          resumes: Sequence[tuple[int, float]] = ()) -> None:
    """``response_lengths.png`` from step records (``pivotflow sim --out`` draws it too)."""
    from matplotlib.figure import Figure

    steps = [float_or_nan(r.get("step")) for r in records]
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(steps, [float_or_nan(r.get("response_len_mean")) for r in records], marker=".",
            markersize=3, color="tab:blue", label="mean response")
    ax.plot(steps, [float_or_nan(r.get("response_len_max")) for r in records], marker=".",
            markersize=3, color="tab:orange", label="longest response")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens")
    ax.set_ylim(bottom=0)
    _mark_resumes(ax, [float(s) for s, _ in resumes])
    ax2 = ax.twinx()
    ax2.plot(steps, [float_or_nan(r.get("response_clip_ratio")) for r in records], linewidth=1.0,
             linestyle="--", color="tab:red", label="cut at the length limit (share)")
    ax2.set_ylabel("share cut at the length limit")
    ax2.set_ylim(-0.02, 1.02)
    lines, labels = ax.get_legend_handles_labels()
    more = ax2.get_legend_handles_labels()
    ax.legend(lines + more[0], labels + more[1], loc="best", fontsize="small")
    ax.set_title("response lengths per step")
    ax.grid(alpha=0.3)
    _save(fig, path)


def _pool_label(name: str, values: list[float]) -> str:
    lo, hi = int(min(values)), int(max(values))
    count = f"{lo}" if lo == hi else f"{lo}-{hi}"
    return f"{name}: {count} worker{'' if hi == 1 else 's'}"


def _draw_pools(ax: Any, timeline: Timeline) -> None:
    from matplotlib.ticker import MaxNLocator

    names = list(timeline)
    for i, name in enumerate(names):
        ts, values = timeline[name]
        shift = (i - (len(names) - 1) / 2) * POOL_OFFSET
        ax.step(ts, [v + shift for v in values], where="post", linewidth=2.0,
                label=_pool_label(name, values))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # workers come whole
    every = [v for _, values in timeline.values() for v in values]
    if every:  # whole numbers of workers around the lines, even when no pool changes
        ax.set_ylim(math.floor(min(every)) - 0.5, math.ceil(max(every)) + 0.5)
    ax.set_ylabel(f"workers\n(lines {POOL_OFFSET:g} apart)" if len(names) > 1 else "workers")


def _pools_queues(records: list[dict[str, Any]], path: Path,
                  resumes: list[tuple[int, float]], flow: list[dict[str, Any]]) -> None:
    from matplotlib.figure import Figure

    times = continuous_times(records)
    panels = 3 if flow else 2
    fig = Figure(figsize=(9, 2.6 * panels + 0.6), layout="constrained")
    axes = fig.subplots(panels, 1, sharex=True)
    _draw_pools(axes[0], pool_timeline(records, resumes))
    if flow:
        flow_t = [float_or_nan(s.get("time_s")) for s in flow]
        for name, values in _series(flow, "queue_depth").items():
            axes[1].step(flow_t, values, where="post", label=name)
        for name, values in _series(flow, "jobs_in_flight").items():
            axes[2].step(flow_t, values, where="post", label=name)
        gaps = sorted(b - a for a, b in zip(flow_t, flow_t[1:], strict=False))
        every = f"sampled every ~{gaps[len(gaps) // 2]:.2g} s" if gaps else "sampled"
        axes[1].set_ylabel(f"queue depth\n({every})")
        axes[2].set_ylabel("jobs in flight")
    else:
        for name, values in _series(records, "queue_depth").items():
            axes[1].plot(times, values, marker=".", label=name)
        axes[1].set_ylabel("queue depth\n(at step ends)")
    shifts = sorted({t for events in placed_shifts(records, times, resumes)
                     for t, _, _ in events})
    for ax in axes:
        for i, t in enumerate(shifts if len(shifts) <= 200 else []):  # too many: lines hide all
            ax.axvline(
                t, color="gray", linestyle="--", linewidth=0.8, label="shift" if i == 0 else None
            )
        _mark_resumes(ax, [t for _, t in resumes])
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    axes[0].set_title("pool sizes, queue depths and jobs in flight over time")
    axes[-1].set_xlabel("time since the run started (s)")
    _save(fig, path)


def path_segments(record: dict[str, Any]) -> list[tuple[str, float, float]]:
    """One step's path as (part, start, end) in time: ``generation`` to the first served
    stage's last sample, each later stage by its name, ``waiting`` from the batch complete to
    the step's start (the previous step, trainers loading), ``training``. A part whose ends
    are not both known (a resumed segment's restored samples keep no times) is left out."""
    points = path_points(record)
    stages = [name for name, _ in points[1:-3]]
    parts = ["generation", *stages[1:], "to the trainer", "waiting", "training"]
    out = []
    for part, (_, a), (_, b) in zip(parts, points, points[1:], strict=False):
        if a is not None and b is not None and b > a:
            out.append((part, float(a), float(b)))
    return out


def plot_step_path(records: list[dict[str, Any]], path: Path) -> None:
    """``step_path.png`` from step records (``pivotflow sim --out`` draws it too)."""
    from matplotlib.figure import Figure

    rows = [r for r in records if r.get("train_started_s") is not None][-STEP_PATH_ROWS:]
    by_part: dict[str, list[tuple[float, float, float]]] = {}
    for r in rows:
        for part, a, b in path_segments(r):
            by_part.setdefault(part, []).append((float_or_nan(r.get("step")), a, b - a))
    fig = Figure(figsize=(9, max(3.0, min(12.0, 1.5 + 0.12 * len(rows)))), layout="constrained")
    ax = fig.add_subplot()
    colors = {"generation": "tab:blue", "to the trainer": "tab:gray", "waiting": "tab:orange",
              "training": "tab:green"}
    spare = iter(["tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"])
    for part, bars in by_part.items():
        ax.barh([st for st, _, _ in bars], [w for _, _, w in bars], left=[a for _, a, _ in bars],
                height=0.8, color=colors.get(part) or next(spare, "tab:red"), label=part)
    ax.set_xlabel("time since the run started (s)")
    ax.set_ylabel("step")
    ax.invert_yaxis()
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    ax.set_title("each step's path: from its last admission to its end")
    ax.grid(alpha=0.3, axis="x")
    _save(fig, path)


def make_plots(
    metrics_path: str | os.PathLike[str], plots_dir: str | os.PathLike[str]
) -> list[Path]:
    """Draw the run's PNGs from ``metrics_path`` (and the flow.jsonl and config.json beside it,
    when there are) into ``plots_dir``; returns the files written.

    Never raises: a missing or malformed metrics file, a missing matplotlib or a drawing error is
    logged as a warning, and the files written before it are returned. No records, no plots. A
    malformed flow.jsonl is a warning too, and the queues come from the step ends instead.
    """
    written: list[Path] = []
    try:
        records = read_metrics(metrics_path)
        if not records:
            return written
        here = Path(metrics_path).parent
        resumes = resume_points(records, continuous_times(records),
                                read_history(here / "config.json"))
        flow: list[dict[str, Any]] = []
        if (here / "flow.jsonl").is_file():
            try:
                flow = flow_timeline(read_flow(here / "flow.jsonl"))
            except Exception as e:  # the step ends still give a plot
                log.warning("queues drawn from the step ends: %s", e)
        out = Path(plots_dir)
        out.mkdir(parents=True, exist_ok=True)
        rounds = read_metrics(here / "eval.jsonl") if (here / "eval.jsonl").is_file() else []
        _reward_accuracy(records, out / REWARD_ACCURACY_PNG, resumes, rounds)
        written.append(out / REWARD_ACCURACY_PNG)
        _pools_queues(records, out / POOLS_QUEUES_PNG, resumes, flow)
        written.append(out / POOLS_QUEUES_PNG)
        if any("response_len_max" in r for r in records):
            plot_response_lengths(records, out / RESPONSE_LENGTHS_PNG, resumes)
            written.append(out / RESPONSE_LENGTHS_PNG)
        if any("train_entropy" in r for r in records):
            _entropy_clip(records, out / ENTROPY_CLIP_PNG, resumes)
            written.append(out / ENTROPY_CLIP_PNG)
        if any(r.get("field_means") or r.get("logged_metrics") for r in records):
            _field_means(records, out / FIELD_MEANS_PNG, resumes)
            written.append(out / FIELD_MEANS_PNG)
        if any("train_kl_ref" in r for r in records):
            _kl_ref(records, out / KL_REF_PNG, resumes)
            written.append(out / KL_REF_PNG)
        if any(r.get("train_started_s") is not None for r in records):
            plot_step_path(records, out / STEP_PATH_PNG)
            written.append(out / STEP_PATH_PNG)
    except Exception as e:  # plots are a courtesy; a broken plot must not fail a finished run
        log.warning("plotting from %s failed after %d file(s): %s", metrics_path, len(written), e)
    return written
