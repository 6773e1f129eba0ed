"""How much the simulated figures depend on responses to one prompt being independent in length:
each shipped group rerun with ``[response] group_share`` (the share of the log-length's variance
a prompt's responses have in common; every shipped workload says 0), under backpressure and the
static analytic split (the split of share 0 for every share, so only the lengths move), with the
bounds for the same setting beside them, and how often prompts wait for a rollout slot (only then
can an order of dispatch, such as a group-informed longest-first one, matter).

Seer (arXiv:2511.14617) reports that responses to one prompt have similar lengths and schedules
on it; no figure for how similar is taken from it here, so the shares are a sweep, not a claim.
Each response's own distribution is the same at every share: only how many independent draws a
step's longest is the largest of moves.

    python bench/sim_group_share.py [--shares 0,0.5,0.8] [--steps 6] [--gpus 128]

Prints a table and, last, one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import sys
from pathlib import Path
from typing import Any

from pivotflow.sim.cluster import SimResult, Split, simulate
from pivotflow.sim.fluid import expected_max, rank_splits
from pivotflow.sim.joint_bound import bounds
from pivotflow.sim.workload import load_workload

HERE = Path(__file__).resolve().parent


def rollout_wait_share(result: SimResult) -> float:
    """The share of the steady steps' trace times (after the first step, up to the last) at
    which prompts wait for a rollout slot: when an order of dispatch (longest-first) could
    matter at all."""
    first, last = result.records[0]["time_s"], result.records[-2]["time_s"]
    waiting = [q.get("prompts->rollout", 0) > 0 for t, q in result.queue_trace
               if first < t <= last]
    return sum(waiting) / len(waiting) if waiting else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shares", default="0,0.5,0.8")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--gpus", type=int, default=128)
    ap.add_argument("--workloads", nargs="*", default=sorted(
        p for p in glob.glob(str(HERE / "workloads" / "*.toml"))
        if not Path(p).name.startswith("cpu_")))
    args = ap.parse_args()
    shares = [float(s) for s in args.shares.split(",")]
    rows: list[dict[str, Any]] = []
    for path in args.workloads:
        base = load_workload(path).scaled(args.gpus)
        split = Split(**rank_splits(base, top=1)[0][1])
        for share in shares:
            wl = dataclasses.replace(
                base, response=dataclasses.replace(base.response, group_share=share),
                steps=args.steps)
            b = bounds(wl)
            row: dict[str, Any] = {
                "workload": wl.name, "gpus": args.gpus, "group_share": share,
                "split": dataclasses.asdict(split),
                "step_longest_tokens": round(expected_max(wl.response, wl.samples_per_step,
                                                          wl.group_size)),
                "nonclairvoyant_bound": b["nonclairvoyant_samples_per_s"],
                "joint_bound": b["joint_samples_per_s"],
            }
            for planner in ("backpressure", "static"):
                result = simulate(wl, planner, split, steps=args.steps, trace_every_s=1.0)
                rate = result.samples_per_s
                row[planner] = rate
                row[f"{planner}_rollout_wait_share"] = rollout_wait_share(result)
                row[f"{planner}_fraction_of_nonclairvoyant"] = rate / b[
                    "nonclairvoyant_samples_per_s"]
            rows.append(row)
            print(f"{wl.name:18s} share {share:.1f}: longest {row['step_longest_tokens']:6d} "
                  f"tokens; backpressure {row['backpressure']:7.2f}, static {row['static']:7.2f}"
                  f" samples/s; nc bound {row['nonclairvoyant_bound']:7.2f} (backpressure "
                  f"{row['backpressure_fraction_of_nonclairvoyant']:.3f}); prompts wait for a "
                  f"rollout slot {row['backpressure_rollout_wait_share']:.0%} of the time",
                  flush=True)
    print(json.dumps({"bench": "sim_group_share", "command": " ".join(["python", *sys.argv]),
                      "steps": args.steps, "rows": rows}))


if __name__ == "__main__":
    main()
