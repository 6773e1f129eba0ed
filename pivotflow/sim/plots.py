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


def plot_pools(result: SimResult, path: Path) -> Path:
    """Workers per pool over virtual time, with optimizer steps marked; returns ``path``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    times = [t for t, _ in result.pool_trace]
    for pool in result.split:
        ax.step(times, [p.get(pool, 0) for _, p in result.pool_trace], where="post", label=pool)
    for rec in result.records:
        ax.axvline(rec["time_s"], color="grey", lw=0.5, ls=":")
    ax.set_xlabel("virtual time (s); dotted: optimizer steps")
    ax.set_ylabel("workers")
    ax.set_title(f"{result.workload}, {result.gpus} GPUs, planner {result.planner}")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
