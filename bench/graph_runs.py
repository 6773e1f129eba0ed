"""Runs of a graph file through the command line, for the benches that compare whole runs
(``bench/ppo_real.py``, ``bench/remote_reward.py``): each run a ``pivotflow run`` process of its
own in a temporary folder, read back, its command kept for the record."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_graph(graph: str, steps: int, sets: list[str]) -> tuple[dict[str, Any],
                                                                 list[dict[str, Any]]]:
    """``pivotflow run GRAPH --steps N --set ...`` from the repo root: (summary.json, the
    metrics.jsonl records). A run that fails ends the bench with its command and stderr's
    tail."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = ["pivotflow", "run", graph, "--steps", str(steps), "--out", str(out)]
        for s in sets:
            cmd += ["--set", s]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-2000:]}")
        summary = json.loads((out / "summary.json").read_text())
        records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    return summary, records


def command(graph: str, steps: int, sets: list[str]) -> str:
    """The command a run's line records (without its temporary ``--out``)."""
    return " ".join(["pivotflow", "run", graph, "--steps", str(steps)]
                    + [f"--set {s}" for s in sets])
