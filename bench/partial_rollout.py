"""Partial rollouts on vs off in the simulator (the real controller in virtual time).

``pivotflow sim`` takes no ``--set``, and the simulator builds its controller's config itself
(pivotflow/sim/cluster.py), so this bench hands it a config class with ``partial_rollout``
set; nothing else of the simulation changes. For each setting: samples/s in the steady state,
the non-clairvoyant bound beside it (pivotflow/sim/fluid.py: computed without partial
rollouts, which it does not model), the share of trained tokens sampled from a version older
than the one a step trains, and the carry-overs and refusals. Last line: one JSON object.

    python bench/partial_rollout.py bench/workloads/dense7b_judge32b.toml --gpus 128 --steps 8
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import pivotflow.sim.cluster as cluster
from pivotflow.controller.core import ControllerConfig
from pivotflow.sim.cluster import Split, simulate
from pivotflow.sim.fluid import fluid_bound, rank_splits
from pivotflow.sim.workload import load_workload


def run(wl: Any, split: Split, planner: str, steps: int, partial: bool,
        over: float = 0.0) -> dict[str, Any]:
    cluster.ControllerConfig = functools.partial(ControllerConfig, partial_rollout=partial,
                                                 over_sample=over)
    try:
        res = simulate(wl, planner, split, steps=steps, wall_limit_s=1800.0)
    finally:
        cluster.ControllerConfig = ControllerConfig
    recs = res.records[1:] or res.records  # the first step fills the pipeline
    tokens = [r["samples"] * r["response_len_mean"] for r in recs]
    stale = sum(t * r["stale_token_share"] for t, r in zip(tokens, recs, strict=True))
    carried = sum(t * r["carried_token_share"] for t, r in zip(tokens, recs, strict=True))
    last = res.records[-1] if res.records else {}
    return {"samples_per_s": round(res.samples_per_s, 3), "sim_s": round(res.sim_s, 1),
            "wall_s": round(res.wall_s, 1), "timed_out": res.timed_out,
            "stale_token_share": round(stale / max(sum(tokens), 1e-9), 4),
            "carried_token_share": round(carried / max(sum(tokens), 1e-9), 4),
            "staleness_max": max(r["staleness_max"] for r in recs),
            "carried_over": last.get("carried_over", 0),
            "groups_refused": last.get("groups_refused", 0),
            "tokens_refused": last.get("tokens_refused", 0),
            "tokens_generated": res.tokens_generated}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workload", type=Path)
    p.add_argument("--gpus", type=int, default=None)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--planner", default="backpressure")
    p.add_argument("--staleness", type=int, default=None, help="replace the file's")
    p.add_argument("--over", type=float, nargs="*", default=[0.25, 0.5],
                   help="over_sample values to run with partial rollouts on")
    args = p.parse_args()
    wl = load_workload(args.workload)
    if args.gpus:
        wl = wl.scaled(args.gpus)
    if args.staleness is not None:
        wl = dataclasses.replace(wl, max_staleness=args.staleness)
    split = Split(**rank_splits(wl, top=1)[0][1])
    off = run(wl, split, args.planner, args.steps, False)
    on = run(wl, split, args.planner, args.steps, True)
    over = {str(x): run(wl, split, args.planner, args.steps, True, x) for x in args.over}
    nc = fluid_bound(wl)["nonclairvoyant_samples_per_s"]
    for r in (off, on, *over.values()):
        r["fraction_of_nonclairvoyant"] = round(r["samples_per_s"] / nc, 4)
        r["over_off"] = round(r["samples_per_s"] / off["samples_per_s"], 4)
    print(json.dumps({"workload": wl.name, "gpus": wl.gpus, "planner": args.planner,
                      "max_staleness": wl.max_staleness, "steps": args.steps,
                      "split": split.as_dict(), "nonclairvoyant_bound": round(nc, 3),
                      "off": off, "on": on, "on_over_sample": over,
                      "on_over_off": round(on["samples_per_s"] / off["samples_per_s"], 4)}))


if __name__ == "__main__":
    main()
