"""PNG plots of a run, drawn from its metrics.jsonl.

* ``reward_accuracy.png``: reward mean and task accuracy per step.
* ``pools_queues.png``: workers per pool and queue depth per edge over time, with each shift
  marked by a vertical line.

Plotting must never fail a run: any error is logged as a warning and the files written so far are
returned. matplotlib is imported here, lazily, and only its object API with the Agg canvas is used
(no pyplot), so no global backend is switched and no window can open.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

from pivotflow.metrics import read_metrics

log = logging.getLogger(__name__)

REWARD_ACCURACY_PNG = "reward_accuracy.png"
POOLS_QUEUES_PNG = "pools_queues.png"


def _num(v: Any) -> float:
    """A record value as a float for plotting; null and non-numbers become NaN (a gap)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def _series(records: list[dict[str, Any]], key: str) -> dict[str, list[float]]:
    """``{name: values}`` of a ``{name: number}`` field, aligned to records (missing -> NaN)."""
    names: list[str] = []
    for r in records:
        for name in r.get(key) or {}:
            if name not in names:
                names.append(name)
    return {n: [_num((r.get(key) or {}).get(n)) for r in records] for n in names}


def _save(fig: Any, path: Path) -> None:
    """Save a figure next to its final name, then rename, so a half-written PNG never shows."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, path)


def _reward_accuracy(records: list[dict[str, Any]], path: Path) -> None:
    from matplotlib.figure import Figure

    steps = [_num(r.get("step")) for r in records]
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(steps, [_num(r.get("reward_mean")) for r in records], marker=".", label="reward mean")
    ax.set_xlabel("step")
    ax.set_ylabel("reward mean")
    accuracy = [_num(r.get("task_accuracy")) for r in records]
    if any(not math.isnan(a) for a in accuracy):
        ax2 = ax.twinx()
        ax2.plot(steps, accuracy, marker=".", color="tab:green", label="task accuracy")
        ax2.set_ylabel("task accuracy")
        ax2.set_ylim(-0.02, 1.02)
        lines = ax.get_lines() + ax2.get_lines()
        ax.legend(lines, [str(ln.get_label()) for ln in lines], loc="best")
    else:
        ax.legend(loc="best")
    ax.set_title("reward and accuracy per step")
    ax.grid(alpha=0.3)
    _save(fig, path)


def _shift_times(records: list[dict[str, Any]]) -> list[float]:
    return [
        _num(e.get("time_s"))
        for r in records
        for e in r.get("shift_events") or []
        if isinstance(e, dict)
    ]


def pool_timeline(records: list[dict[str, Any]]) -> dict[str, tuple[list[float], list[float]]]:
    """Workers per pool as step functions of time, replayed from the shift events (a step's
    record only sees the pools at its end, which would hide every shift within a step)."""
    events = sorted((_num(e.get("time_s")), e.get("from"), e.get("to"))
                    for r in records for e in r.get("shift_events") or [] if isinstance(e, dict))
    sizes = {k: _num(v) for k, v in (records[0].get("pools") or {}).items()}
    for _, src, dst in (e for e in events if e[0] <= _num(records[0].get("time_s"))):
        sizes[src] = sizes.get(src, 0.0) + 1  # undo the first step's shifts: the start
        sizes[dst] = sizes.get(dst, 0.0) - 1
    out = {k: ([0.0], [v]) for k, v in sizes.items()}
    for t, src, dst in events:
        for name, delta in ((src, -1.0), (dst, 1.0)):
            ts, vs = out.setdefault(name, ([0.0], [0.0]))
            ts.append(t)
            vs.append(vs[-1] + delta)
    end = _num(records[-1].get("time_s"))
    for ts, vs in out.values():
        ts.append(end)
        vs.append(vs[-1])
    return out


def _pools_queues(records: list[dict[str, Any]], path: Path) -> None:
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    times = [_num(r.get("time_s")) for r in records]
    fig = Figure(figsize=(8, 6), layout="constrained")
    ax_pool, ax_queue = fig.subplots(2, 1, sharex=True)
    for name, (ts, values) in pool_timeline(records).items():
        ax_pool.step(ts, values, where="post", label=name)
    for name, values in _series(records, "queue_depth").items():
        ax_queue.plot(times, values, marker=".", label=name)
    shifts = [t for t in _shift_times(records) if not math.isnan(t)]
    for ax in (ax_pool, ax_queue):
        for i, t in enumerate(shifts if len(shifts) <= 200 else []):  # too many: lines hide all
            ax.axvline(
                t, color="gray", linestyle="--", linewidth=0.8, label="shift" if i == 0 else None
            )
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize="small")
    ax_pool.yaxis.set_major_locator(MaxNLocator(integer=True))  # workers come whole
    ax_pool.set_ylabel("workers")
    ax_pool.set_title("pool sizes and queue depths over time")
    ax_queue.set_ylabel("queue depth")
    ax_queue.set_xlabel("time (s)")
    _save(fig, path)


def make_plots(
    metrics_path: str | os.PathLike[str], plots_dir: str | os.PathLike[str]
) -> list[Path]:
    """Draw the run's PNGs from ``metrics_path`` into ``plots_dir``; returns the files written.

    Never raises: a missing or malformed metrics file, a missing matplotlib or a drawing error is
    logged as a warning, and the files written before it are returned. No records, no plots.
    """
    written: list[Path] = []
    try:
        records = read_metrics(metrics_path)
        if not records:
            return written
        out = Path(plots_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, draw in (
            (REWARD_ACCURACY_PNG, _reward_accuracy),
            (POOLS_QUEUES_PNG, _pools_queues),
        ):
            draw(records, out / name)
            written.append(out / name)
    except Exception as e:  # plots are a courtesy; a broken plot must not fail a finished run
        log.warning("plotting from %s failed after %d file(s): %s", metrics_path, len(written), e)
    return written
