"""What each lever is worth in a simulated run: the shipped run beside the same run with one
thing changed, to find where a planner's time goes before building anything (issue 24: the
planners reach 0.66-0.76 of the joint bound).

Each lever is a change made for one run and undone after it (nothing shipped changes):

* ``train=F``: every optimizer step's compute takes ``F`` times the cost model's (``F`` < 1
  asks how much the steps' length holds the pipeline back);
* ``rollout_batch=F``: a rollout worker holds ``F`` times the sequences its memory fits
  (smaller batches decode each step faster: the tail's latency against the throughput);
* ``tail_fill=F``: backpressure's ``TAIL_FILL`` (the share of slots a tail is packed into
  before its workers may go);
* ``blocks=0``: backpressure's block moves off (lending to a ready step, and re-sizes, stay);
* ``lending=0``: lending to a ready step off.

Virtual time, so the figures do not move with the host's load; the last line is one JSON
object with each run's samples/s (steady state, as ``pivotflow sim``) and its ratio to the
shipped run (``over_shipped``), and the command. Results: bench/results/sim_levers_*.json.

    python bench/sim_levers.py bench/workloads/drift/dense7b_judge32b.toml --at 5 --steps 8 \
        --planner adaptive --lever train=0.1 --lever rollout_batch=0.7 --lever blocks=0
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pivotflow.planner.backpressure as bp
import pivotflow.sim.cluster as cluster
from pivotflow.sim.cost_model import CostModel
from pivotflow.sim.fluid import rank_splits
from pivotflow.sim.workload import load_workload

LEVERS = ("train", "rollout_batch", "tail_fill", "blocks", "lending")


@contextlib.contextmanager
def lever(name: str, value: float) -> Iterator[None]:
    """The change ``name=value`` for the duration of one run."""
    undo: list[tuple[Any, str, Any]] = []

    def swap(owner: Any, attr: str, new: Any) -> None:
        undo.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, new)

    if name == "train":
        train_s, world_s = CostModel.train_s, CostModel.train_world_s
        swap(CostModel, "train_s", lambda self, *a, **k: train_s(self, *a, **k) * value)
        swap(CostModel, "train_world_s", lambda self, *a, **k: (
            None if (t := world_s(self, *a, **k)) is None else t * value))
    elif name == "rollout_batch":
        options = cluster.role_options

        def scaled(wl: Any, cost: Any) -> dict[str, dict[str, Any]]:
            out = options(wl, cost)
            out["rollout"]["max_batch"] = max(1, round(out["rollout"]["max_batch"] * value))
            return out

        swap(cluster, "role_options", scaled)
    elif name == "tail_fill":
        swap(bp, "TAIL_FILL", value)
    elif name == "blocks" and not value:
        swap(bp.BackpressurePlanner, "_best_move", lambda self, *a: [])
    elif name == "lending" and not value:
        swap(bp.BackpressurePlanner, "_size_trainers", lambda self, *a: [])
    elif name not in LEVERS:
        raise SystemExit(f"--lever {name}={value}: unknown lever; one of {', '.join(LEVERS)}")
    try:
        yield
    finally:
        for owner, attr, old in reversed(undo):
            setattr(owner, attr, old)


def run(path: Path, planner: str, steps: int | None, gpus: int | None,
        split: str | None, at: int | None) -> dict[str, Any]:
    wl = load_workload(path)
    if at is not None:  # a drifting file held at one step's regime
        wl = wl.at(at)
    if gpus:
        wl = wl.scaled(gpus)
    if split:
        sizes = cluster.Split(*(int(x) for x in split.split(",")))
    else:
        sizes = cluster.Split(**rank_splits(wl.at(0) if wl.schedule else wl, top=1)[0][1])
    res = cluster.simulate(wl, planner, sizes, steps=steps or wl.steps, wall_limit_s=3000.0)
    return {"samples_per_s": round(res.samples_per_s, 3), "sim_s": round(res.sim_s, 1),
            "shifts": len(res.shifts), "wall_s": round(res.wall_s, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workload", type=Path)
    p.add_argument("--planner", default="adaptive")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--gpus", type=int, default=None)
    p.add_argument("--split", default=None, help="R,J,T (default: the best analytic split)")
    p.add_argument("--at", type=int, default=None,
                   help="a drifting file held at this step's regime (e.g. 5: the late one)")
    p.add_argument("--lever", action="append", default=[], help="NAME=VALUE (repeatable)")
    args = p.parse_args(argv)
    chosen = []
    for item in args.lever:  # checked before any run
        name, _, text = item.partition("=")
        try:
            value = float(text)
        except ValueError:
            raise SystemExit(f"--lever {item}: expected NAME=NUMBER") from None
        if name not in LEVERS:
            raise SystemExit(f"--lever {name}={value}: unknown lever; one of {', '.join(LEVERS)}")
        chosen.append((item, name, value))
    shipped = run(args.workload, args.planner, args.steps, args.gpus, args.split, args.at)
    print(json.dumps({"shipped": shipped}), flush=True)
    out: dict[str, Any] = {"workload": str(args.workload), "at": args.at,
                           "planner": args.planner, "shipped": shipped, "levers": {},
                           "command": " ".join(["python bench/sim_levers.py", *(
                               argv if argv is not None else sys.argv[1:])])}
    for item, name, value in chosen:
        with lever(name, value):
            got = run(args.workload, args.planner, args.steps, args.gpus, args.split, args.at)
        got["over_shipped"] = round(got["samples_per_s"] / shipped["samples_per_s"], 4)
        out["levers"][item] = got
        print(json.dumps({item: got}), flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
