"""Chaos: the GenRM graph with a worker SIGKILLed every 15 s; nothing may be lost or doubled.

    python bench/chaos.py [--steps 300] [--every 15] [--out DIR]

Runs graphs/grpo_genrm.py on real processes with ``--set chaos.kill_worker_every_s=EVERY``
(the default elastic planner) and prints one JSON object on its last line: wall time, kills,
restarts, re-dispatched jobs, train steps redone, the ledger (lost and duplicates must be 0),
and task_accuracy at the start and end (mean of the first and last tenth of the steps).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from pivotflow.run import run

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=float, default=15.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="pivotflow-chaos-"))
    res = run(ROOT / "graphs" / "grpo_genrm.py",
              sets=["live=false", f"chaos.kill_worker_every_s={args.every}",
                    "max_worker_restarts=1000"],
              out=out, steps=args.steps, console=False)
    s = res.summary
    print(json.dumps({
        "bench": "chaos", "steps": s["steps"], "wall_s": s["wall_s"], "kill_every_s": args.every,
        "chaos_kills": s["chaos_kills"], "worker_restarts": s["worker_restarts"],
        "jobs_redispatched": s["jobs_redispatched"], "train_steps_redone":
        s["train_steps_redone"], "late_results": s["late_results"], "ledger": s["ledger"],
        "task_accuracy_start": s["task_accuracy_start"],
        "task_accuracy_end": s["task_accuracy_end"], "out": str(out)}))
    return 0 if s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
