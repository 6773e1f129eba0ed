"""The KL penalty's cost and effect: graphs/grpo_genrm.py with and without a reference model,
side by side in one sitting, on the built-in models and the same seed and worker count.

For each ``kl_coef`` (0 = no reference stage, the default): samples/s, the task accuracy of the
first and last tenth of the steps, and the KL to the reference over the last tenth
(``train_kl_ref``, only with one); the reference pool's extra work shows as the samples/s
ratio against the run without it (same total workers, so the reference takes one from the
others). A larger ``kl_coef`` should hold the KL lower at a similar accuracy gain.

    python bench/reference_kl.py [--steps 60] [--workers 4] [--coefs 0,0.04,0.4]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
GRAPH = ROOT / "graphs" / "grpo_genrm.py"


def one_run(coef: float, steps: int, workers: int, out: Path) -> dict[str, Any]:
    from pivotflow.metrics import read_metrics
    from pivotflow.run import run

    sets = ["live=false", f"graph.kl_coef={coef}"]
    t0 = time.perf_counter()
    result = run(GRAPH, sets=sets, out=out, workers=workers, steps=steps, console=False)
    wall = time.perf_counter() - t0
    records = read_metrics(out / "metrics.jsonl")
    tenth = max(1, len(records) // 10)
    kl = [r["train_kl_ref"] for r in records[-tenth:] if "train_kl_ref" in r]
    s = result.summary
    return {"kl_coef": coef, "steps": len(records), "wall_s": round(wall, 1),
            "samples_per_s": round(s["samples_per_s"], 3),
            "task_accuracy_start": s["task_accuracy_start"],
            "task_accuracy_end": s["task_accuracy_end"],
            "kl_ref_last_tenth": round(statistics.mean(kl), 5) if kl else None,
            "lost": s["ledger"]["lost"], "duplicates": s["ledger"]["duplicates"],
            "shifts": s["shifts"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--coefs", default="0,0.04,0.4")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args()
    console = Console(stderr=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="pivotflow-refkl-") as tmp:
        for coef in (float(c) for c in args.coefs.split(",")):
            with console.status(f"grpo_genrm, kl_coef={coef}, {args.steps} steps"):
                out = Path(tmp) / f"run{len(runs)}-kl{coef}"
                runs.append(one_run(coef, args.steps, args.workers, out))
            console.print(runs[-1])
    base = runs[0]["samples_per_s"]
    for r in runs:
        r["samples_per_s_over_first"] = round(r["samples_per_s"] / base, 3) if base else None
    line = {"bench": "reference_kl", "graph": "graphs/grpo_genrm.py", "workers": args.workers,
            "steps": args.steps, "runs": runs}
    if args.out is not None:
        args.out.write_text(json.dumps(line) + "\n")
    print(json.dumps(line))


if __name__ == "__main__":
    main()
