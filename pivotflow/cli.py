"""``pivotflow run | inspect | sim``: the command line."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pivotflow.errors import PivotflowError, RunInterrupted, RunTerminated

if TYPE_CHECKING:
    from rich.console import Console


def _cmd_run(args: argparse.Namespace, console: Console) -> int:
    from pivotflow.run import run

    result = run(args.graph, sets=args.set, out=args.out, workers=args.workers,
                 steps=args.steps, console=console, resume=args.resume,
                 accept_changes=args.accept_changes)
    s = result.summary
    if s["steps"] == 0:  # an evaluation-only run (--steps 0 --set eval_every=1)
        console.print(f"[bold green]evaluated[/] the policy in {s['wall_s']:.1f}s: task_accuracy "
                      f"{_fmt(s.get('eval_task_accuracy_last'))}, pass@n "
                      f"{_fmt(s.get('eval_task_pass_at_n_last'))}; records in {result.out}")
        return 0
    resumed = (f" (resumed from step {s['resumed_from_step']}; totals cover the whole run)"
               if s.get("resumed_from_step") is not None else "")
    console.print(f"[bold green]done[/] {s['steps']} steps in {s['wall_s']:.1f}s{resumed}, "
                  f"{s['samples_per_s']:.1f} samples/s; accuracy "
                  f"{_fmt(s.get('task_accuracy_start'))} -> {_fmt(s.get('task_accuracy_end'))} (mean of the "
                  "first/last tenth of the steps); "
                  f"records in {result.out}")
    return 0


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _cmd_inspect(args: argparse.Namespace, console: Console) -> int:
    from pivotflow.graph_check import load_graph

    console.print(load_graph(args.graph).describe(), highlight=False, soft_wrap=True)
    return 0


def _cmd_model(args: argparse.Namespace, console: Console) -> int:
    from pivotflow.errors import CheckpointError
    from pivotflow.model_info import describe_families, describe_model

    if args.families:
        console.print(describe_families(), highlight=False, soft_wrap=True, markup=False)
        return 0
    if args.folder is None:
        raise CheckpointError("pivotflow model needs a model FOLDER (or --families)")
    console.print(describe_model(args.folder), highlight=False, soft_wrap=True, markup=False)
    return 0


SIM_HELP = "simulate a workload on a virtual GPU cluster"  # as pivotflow.sim.cli says


def build_parser(*, with_sim: bool = True) -> argparse.ArgumentParser:
    """The command line; ``with_sim=False`` names ``sim`` without loading its arguments."""
    ap = argparse.ArgumentParser(prog="pivotflow", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a graph file")
    r.add_argument("graph", type=Path)
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting (repeatable); unknown keys are an error")
    r.add_argument("--out", type=Path, default=None, help="run records folder")
    r.add_argument("--workers", type=int, default=None, help="total worker processes")
    r.add_argument("--steps", type=int, default=None,
                   help="optimizer steps (0, with --set eval_every=1: one evaluation round of "
                   "the policy, no training)")
    r.add_argument("--resume", default=None, metavar="DIR|auto",
                   help="continue a run from its newest whole checkpoint, with its settings "
                   "(--set and --steps change them; --steps N extends a finished run); auto: "
                   "--out's if it has one, else the newest run of the graph under runs/")
    r.add_argument("--accept-changes", action="store_true",
                   help="resume even though the graph, its models, data or settings that "
                   "shape the checkpoint differ (recorded in config.json's history)")
    r.set_defaults(func=_cmd_run)
    i = sub.add_parser("inspect", help="validate a graph file and print its stages and pools")
    i.add_argument("graph", type=Path)
    i.set_defaults(func=_cmd_inspect)
    m = sub.add_parser("model", help="read a Hugging Face model folder as a run would and say "
                       "what pivotflow runs")
    m.add_argument("folder", type=Path, nargs="?")
    m.add_argument("--families", action="store_true",
                   help="list the model_types pivotflow runs (decoders and multimodal wrappers)")
    m.set_defaults(func=_cmd_model)
    if with_sim:
        from pivotflow.sim.cli import add_sim_parser

        add_sim_parser(sub)
    else:  # listed, but the simulator (which imports the whole controller) is not loaded
        sub.add_parser("sim", help=SIM_HELP)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Only ``pivotflow sim ...`` needs the simulator's own arguments; --help, run and inspect
    # start faster without importing it.
    args = build_parser(with_sim=argv[:1] == ["sim"]).parse_args(argv)
    from rich.console import Console  # after parsing: --help prints without loading rich
    from rich.markup import escape

    console = Console(stderr=True)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args, console))
    except KeyboardInterrupt:  # outside the event loop, where the run's own handler is
        console.print("[yellow]interrupted (Ctrl-C) while the run was starting or writing its "
                      "records[/]")
        return 130
    except RunInterrupted as exc:  # the message says what was checkpointed, how to resume
        console.print(f"[yellow]{escape(str(exc))}[/]", highlight=False, soft_wrap=True)
        return 143 if isinstance(exc, RunTerminated) else 130
    except PivotflowError as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
