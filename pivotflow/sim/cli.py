"""``pivotflow sim WORKLOAD``: run one workload on a simulated cluster in virtual time.

Wiring (in ``pivotflow/cli.py``): ``add_sim_parser(sub)``; the parser's default ``func``
calls ``run_sim(args)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from pivotflow.config import parse_overrides, resolve
from pivotflow.errors import ConfigError
from pivotflow.planner import make_planner, parse_groups
from pivotflow.planner.backpressure import BackpressureConfig
from pivotflow.sim.cluster import POOLS, Split, simulate
from pivotflow.sim.fluid import rank_splits
from pivotflow.sim.joint_bound import bounds
from pivotflow.sim.workload import load_workload


def _split(text: str) -> Split:
    try:
        r, j, t = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--split {text!r}: expected three worker counts ROLLOUT,GENRM,TRAINER"
        ) from None
    return Split(r, j, t)


# What ``--set`` may change in a simulated run: the controller's knobs the simulator passes on,
# and the backpressure planners' (the rest of a run's keys are a real run's: engines, launcher)
SIM_SET_KEYS = ("max_staleness", "partial_rollout", "over_sample", "warm_roles",
                *(f"planner.{k}" for k in BackpressureConfig.__struct_fields__))


def sim_settings(items: list[str], planner: str) -> tuple[dict[str, Any], Any]:
    """``--set KEY=VALUE`` items -> (the given keys as parsed, the RunConfig they resolve to),
    with the run's own parser and checks (pivotflow/config.py); raises ConfigError naming a key
    the simulator does not take and listing those it does."""
    given = parse_overrides(items)
    for key in given:
        if key not in SIM_SET_KEYS:
            raise ConfigError(f"--set {key}: not a simulator knob; valid keys: "
                              f"{', '.join(SIM_SET_KEYS)}")
    return given, resolve({**given, "planner": planner}, {}, list(POOLS))


def add_sim_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``sim`` subcommand to ``subparsers`` (an argparse subparsers action)."""
    p = subparsers.add_parser(
        "sim",
        help="simulate a workload on a virtual GPU cluster",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("workload", type=Path, help="workload file (bench/workloads/*.toml)")
    p.add_argument("--gpus", type=int, default=None, help="cluster size (default: the file's)")
    p.add_argument("--planner", default="backpressure", help="planner name (make_planner)")
    p.add_argument(
        "--colocate",
        default="",
        metavar="A+B[,C+D]",
        help="static only: pools that time-share their workers in phases (as --set colocate)",
    )
    p.add_argument(
        "--split",
        type=_split,
        default=None,
        metavar="R,J,T",
        help="initial workers per pool rollout,genrm,trainer (default: the best analytic split)",
    )
    p.add_argument("--steps", type=int, default=None, help="optimizer steps to simulate")
    p.add_argument(
        "--hours",
        type=float,
        default=None,
        help="stop after this much virtual time (steps then default to many)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="controller and planner knobs: " + ", ".join(SIM_SET_KEYS[:3]) + ", planner.*",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write summary.json, metrics.jsonl and plots/ (pools, step_path, response_lengths) here",
    )
    p.set_defaults(func=lambda args, console=None: run_sim(args))
    return p


def run_sim(args: argparse.Namespace) -> int:
    """Run the simulation ``args`` describe; print its summary as one JSON line. Returns 0.

    Raises ConfigError for a bad workload file, GPU count, split or ``--set`` key, and the
    controller's error if the simulated run fails.
    """
    wl = load_workload(args.workload)
    given, cfg = sim_settings(args.overrides, args.planner)
    if args.gpus is not None:
        wl = wl.scaled(args.gpus)
    if "max_staleness" in given:
        wl = dataclasses.replace(wl, max_staleness=cfg.max_staleness)
    controller: dict[str, Any] = {k: getattr(cfg, k) for k in ("partial_rollout", "over_sample",
                                                                  "warm_roles")
                                  if k in given}
    ranked = rank_splits(wl, top=1)
    if args.split is None and not ranked:
        raise ConfigError(f"{args.workload}: {wl.gpus // wl.group_gpus} workers for 3 pools: "
                          "give --split R,J,T (a pool may start empty)")
    split = args.split or Split(**ranked[0][1])
    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps {args.steps}: must be at least 1")
    steps = args.steps or (10**6 if args.hours else wl.steps)
    horizon = args.hours * 3600 if args.hours else 10 * 24 * 3600.0
    planner: Any = args.planner
    if any(k.startswith("planner.") for k in given):
        planner = make_planner(args.planner, knobs=cfg.planner_knobs)
    if args.colocate:
        if args.planner != "static":
            raise ConfigError(f"--colocate {args.colocate}: only the static planner takes pool "
                              f"groups, not {args.planner!r}")
        try:
            planner = make_planner("static", parse_groups(args.colocate, list(POOLS)))
        except ValueError as exc:
            raise ConfigError(f"--colocate {args.colocate}: {exc}") from None
    result = simulate(
        wl, planner, split, steps=steps, horizon_s=horizon, seed=args.seed, wall_limit_s=3600.0,
        controller=controller,
    )
    summary = result.summary()
    summary["set"] = given
    if wl.schedule is not None:  # a drifting bound is over the steps this run simulated
        wl = dataclasses.replace(wl, steps=max(1, int(summary["steps"])))
    fluid = bounds(wl)
    summary["fluid_bound"] = round(fluid["samples_per_s"], 4)
    summary["fraction_of_fluid"] = round(result.samples_per_s / fluid["samples_per_s"], 4)
    nc = fluid["nonclairvoyant_samples_per_s"]  # the bound when lengths are not known ahead
    summary["nonclairvoyant_bound"] = round(nc, 4)
    summary["fraction_of_nonclairvoyant"] = round(result.samples_per_s / nc, 4)
    joint = fluid["joint_samples_per_s"]  # both limits paid on the same GPUs
    summary["joint_bound"] = round(joint, 4)
    summary["fraction_of_joint"] = round(result.samples_per_s / joint, 4)
    if args.out is not None:
        from pivotflow.metrics_plots import (
            RESPONSE_LENGTHS_PNG,
            STEP_PATH_PNG,
            plot_response_lengths,
            plot_step_path,
        )
        from pivotflow.sim.plots import plot_pools

        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        with open(args.out / "metrics.jsonl", "w") as f:
            for rec in result.records:
                f.write(json.dumps(rec) + "\n")
        plot_pools(result, args.out / "plots" / "pools.png")
        plot_step_path(result.records, args.out / "plots" / STEP_PATH_PNG)
        plot_response_lengths(result.records, args.out / "plots" / RESPONSE_LENGTHS_PNG)
    print(json.dumps(summary))
    return 0
