"""Plots of simulated runs: pool sizes over time, throughput by planner and GPU count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pivotflow.sim.cluster import SimResult


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path, dpi: int) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def plot_pools(result: SimResult, path: Path, ax: Any = None) -> Path:
    """Workers per pool over virtual time, with optimizer steps marked (dotted) and the
    planner's re-sizings of its standing split (decisions with ``resize``: red ticks at the
    top); returns ``path`` (draws into ``ax`` and saves nothing when one is given)."""
    plt = _pyplot()
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(8, 3.5))
    times = [t for t, _ in result.pool_trace]
    for pool in result.split:
        ax.step(times, [p.get(pool, 0) for _, p in result.pool_trace], where="post", label=pool)
    for rec in result.records:
        ax.axvline(rec["time_s"], color="grey", lw=0.5, ls=":")
    resizes = sorted({d["time_s"] for d in result.decision_log if d.get("resize")})
    if resizes:
        top = max(max(p.values()) for _, p in result.pool_trace) if result.pool_trace else 1
        ax.plot(resizes, [top * 1.05] * len(resizes), "rv", ms=5, label="re-size")
    ax.set_xlabel("virtual time (s); dotted: optimizer steps")
    ax.set_ylabel("workers")
    ax.set_title(f"{result.workload}, {result.gpus} GPUs, planner {result.planner}", fontsize=9)
    ax.legend(loc="upper right", fontsize=7)
    if not own:
        return path
    return _save(plt, fig, path, 110)


def plot_throughput(
    rows: list[dict[str, Any]], path: Path, blind: dict[tuple[str, int], float] | None = None
) -> Path:
    """Samples/s (as a fraction of the fluid bound) per workload, planner and GPU count, and
    the bound of a scheduler blind to response lengths (``blind``: (workload, gpus) -> that
    bound over the fluid one) as a dashed line.

    ``rows``: dicts with ``workload``, ``gpus``, ``planner``, ``samples_per_s``, ``fluid``.
    """
    plt = _pyplot()
    workloads = sorted({r["workload"] for r in rows})
    fig, axes = plt.subplots(1, len(workloads), figsize=(4 * len(workloads), 3.5), squeeze=False)
    for ax, wl in zip(axes[0], workloads, strict=False):
        mine = [r for r in rows if r["workload"] == wl and r["samples_per_s"] is not None]
        gpus = sorted({r["gpus"] for r in mine})
        for planner in sorted({r["planner"] for r in mine}):
            pts = [
                (r["gpus"], r["samples_per_s"] / r["fluid"])
                for r in mine
                if r["planner"] == planner
            ]
            pts.sort()
            ax.plot([g for g, _ in pts], [v for _, v in pts], marker="o", label=planner)
        seen = [(g, blind[(wl, g)]) for g in gpus if blind and (wl, g) in blind]
        if seen:
            ax.plot([g for g, _ in seen], [v for _, v in seen], "k--", lw=1,
                    label="non-clairvoyant bound")
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [str(g) for g in gpus])
        ax.set_ylim(0, 1.05)
        ax.set_title(wl, fontsize=9)
        ax.set_xlabel("GPUs")
    axes[0][0].set_ylabel("samples/s / fluid bound")
    axes[0][0].legend(fontsize=8)
    return _save(plt, fig, path, 110)


def plot_pools_grid(results: list[SimResult], path: Path) -> Path:
    """``plot_pools`` of several runs, one panel each (a drifting run per group)."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(results), 1, figsize=(8, 2.8 * len(results)), squeeze=False)
    for ax, r in zip(axes[:, 0], results, strict=True):
        plot_pools(r, path, ax=ax)
    return _save(plt, fig, path, 100)


def plot_regimes(groups: list[dict[str, Any]], path: Path) -> Path:
    """Samples/s per planner in each regime of a drifting run (early, late) and over the
    whole run, one panel per group, with the non-clairvoyant bound of each as a black tick
    and the joint bound (where the summary has it) dashed.

    ``groups``: ``bench/sim_drift.py`` summaries (``regimes``, ``samples_per_s``, ``bound``).
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 3.6), squeeze=False)
    for ax, g in zip(axes[0], groups, strict=True):
        planners = list(g["samples_per_s"])
        cols = [*g["regimes"], "whole"]
        width = 0.8 / (len(planners) + (1 if g["regimes"] else 0))
        for i, p in enumerate(planners):
            vals = [g["regimes"][c].get(p) if c != "whole" else g["samples_per_s"][p]
                    for c in cols]
            ax.bar([j + i * width for j in range(len(cols))], [v or 0 for v in vals], width,
                   label=p)
        if g["regimes"]:
            fresh = [g["regimes"][c].get("fresh_same_steps") or g["regimes"][c]["fresh"]
                     if c != "whole" else 0 for c in cols]
            ax.bar([j + len(planners) * width for j in range(len(cols))], fresh, width,
                   label=f"{g['planner']} fresh", color="k", alpha=0.3)
        bounds = [g["regimes"][c]["bound_nonclairvoyant"] if c != "whole"
                  else g["bound"]["nonclairvoyant"] for c in cols]
        for j, b in enumerate(bounds):
            ax.plot([j - width / 2, j + 0.8 - width / 2], [b, b], "k-", lw=1.5)
        if "joint" in g["bound"]:  # (summaries made before the joint bound have none)
            joint = [g["regimes"][c].get("bound_joint") if c != "whole" else g["bound"]["joint"]
                     for c in cols]
            for j, b in enumerate(joint):
                if b is not None:
                    ax.plot([j - width / 2, j + 0.8 - width / 2], [b, b], "k--", lw=1.0)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cols))], cols)
        ax.set_title(f"{g['workload']} @ {g['gpus']}", fontsize=9)
        ax.set_ylabel("samples/s (lines: non-clairvoyant,\ndashed: joint bound)")
    axes[0][0].legend(fontsize=7)
    return _save(plt, fig, path, 100)
