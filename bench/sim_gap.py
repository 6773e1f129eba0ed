"""Where a simulated run's time goes, against the bounds (issue 24: planners at 0.6-0.7 of the
non-clairvoyant bound). One simulation, sampled every ``--every`` virtual seconds: each GPU group
is loading a role (a shift), training, generating (rollout or judge) or idle in its pool. A
generating group's time is ``prefill`` while its batch is stalled (prefilling arrivals, a weight
sync), the rest split by how full its batch is: ``filled`` is the share of its
decode capacity it uses (tokens per second at its batch over those at the batch its memory
holds, from the cost model's step time), the rest ``underfilled`` (the generation tail, a pool
starved by the one before it). Idle rollout groups wait for admission (the ``max_staleness``
barrier: no group of the next step may start before the step ``max_staleness`` back is trained)
or for the step's last groups; idle judges wait for responses; idle trainers for a batch.

The instrument is a subclass of the simulator's worker that records its state (patched into
``pivotflow.sim.cluster`` for the run; nothing of the run changes). Per step window (steps 1 to
the last, as the bounds are taken), the shares of GPU-time per category, and the work bound's
share: the GPU-seconds the run's samples need at full batch over the GPU-seconds spent (the
fraction of the work bound the run reaches, when every GPU is counted). And each step's path
from its run record (``path_s``): the seconds from its last group's admission to the last
sample out of each served stage, to the batch complete at the train stage, to its optimizer
step's start, to its end, per step and their mean over the window; under ``max_staleness`` S
two periods hold one such path when S is 1 (step k is admitted when step k-2 ends). Last
line: one JSON object.

    python bench/sim_gap.py bench/workloads/drift/dense7b_judge32b.toml --gpus 128 \
        --planner adaptive --split 14,34,16
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pivotflow.sim.cluster as cluster
from pivotflow.controller.records import path_points
from pivotflow.sim.cost_model import CostModel
from pivotflow.sim.fluid import fluid_bound, rank_splits, role_rates
from pivotflow.sim.sim_worker import SimWorker
from pivotflow.sim.workload import Workload, load_workload


class Probe:
    """The state of every worker every ``every`` virtual seconds, into ``share[(step, cat)]``."""

    def __init__(self, wl: Workload, every: float) -> None:
        self.wl, self.every = wl, every
        self.workers: list[Any] = []
        self.gpu_s: dict[tuple[int, str], float] = defaultdict(float)
        self.full: dict[tuple[int, str], float] = {}  # (version, model) -> full-batch tokens/s
        self.version = 0
        self.started = False

    def full_rate(self, version: int, model: str) -> tuple[int, float]:
        """(the batch one worker's memory holds, its tokens/s at that batch) at ``version``."""
        key = (version, model)
        if key not in self.full:
            wl = self.wl.at(version)
            cost = CostModel(wl)
            opts = cluster.role_options(wl, cost)
            pool = "rollout" if model == "policy" else "genrm"
            b = opts[pool]["max_batch"]
            m = cost.model(model)
            r = cost.replicas(m, wl.group_gpus)
            ctx = cost.mean_prompt() + cost.mean_response() / 2
            if model == "judge":
                ctx = cost.judge_prompt_tokens(cost.mean_prompt(), cost.mean_response())
            per = b / r
            self.full[key] = (b, b / cost.decode(m, per).step_s(per, per * ctx))
        return self.full[key]

    def tick(self, loop: Any) -> None:
        ver = self.version
        for w in self.workers:
            if getattr(w, "_probe_loading", False):
                cat = "shift"
            elif getattr(w, "_probe_training", False):
                cat = "train"
            elif w.engine is not None and w.engine.seqs:
                pool = "rollout" if w.model_name == "policy" else "genrm"
                if w.engine.t0 > loop.time():  # stalled: prefilling arrivals or a weight sync
                    self.gpu_s[(ver, f"{pool}_prefill")] += self.every
                    continue
                b_full, rate_full = self.full_rate(self.version, w.model_name)
                eng = w.engine
                b = len(eng.seqs)
                step = eng.steps_time(1) / max(eng.slow, 1e-9) or 1e-9
                fill = min(1.0, (b / step) / rate_full)
                self.gpu_s[(ver, f"{pool}_filled")] += fill * self.every
                self.gpu_s[(ver, f"{pool}_underfilled")] += (1 - fill) * self.every
                continue
            elif w.role == "train":
                cat = "trainer_idle"
            elif w.model_name == "policy":
                cat = "rollout_idle"
            elif w.model_name == "judge":
                cat = "genrm_idle"
            else:
                cat = "no_role"
            self.gpu_s[(ver, cat)] += self.every
        loop.call_later(self.every, self.tick, loop)


def probed_worker(probe: Probe) -> type:
    class ProbedWorker(SimWorker):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            probe.workers.append(self)
            if not probe.started:
                probe.started = True
                self._loop.call_soon(probe.tick, self._loop)

        def _assign(self, msg: Any) -> None:
            self._probe_loading = True
            super()._assign(msg)

        def _assigned(self, *a: Any) -> None:
            self._probe_loading = False
            super()._assigned(*a)

        def _train(self, msg: Any) -> None:
            self._probe_training = True
            super()._train(msg)

        def _trained(self, msg: Any, *a: Any) -> None:
            self._probe_training = False
            probe.version = max(probe.version, msg.step + 1)
            super()._trained(msg, *a)

    return ProbedWorker


def path_gaps(record: dict[str, Any]) -> dict[str, float]:
    """One step's path as consecutive gaps, named ``"from->to"``: ``admitted``, each served
    stage, ``ready`` (the batch complete), ``started``, ``done``; they add up to the step's time
    from its last admission to its end."""
    points = path_points(record)
    return {f"{a}->{b}": round(tb - ta, 3)
            for (a, ta), (b, tb) in zip(points, points[1:], strict=False)}


def decompose(wl: Workload, planner: str, split: cluster.Split, steps: int,
              every: float) -> dict[str, Any]:
    probe = Probe(wl, every)
    orig = cluster.SimWorker
    cluster.SimWorker = probed_worker(probe)  # type: ignore[misc]
    try:
        res = cluster.simulate(wl, planner, split, steps=steps, wall_limit_s=3000.0)
    finally:
        cluster.SimWorker = orig  # type: ignore[misc]
    recs = res.records
    window = range(1, len(recs))  # versions 1.. (the first step's fill left out, as the bounds)
    total: dict[str, float] = defaultdict(float)
    for (v, cat), s in probe.gpu_s.items():
        if v in window:
            total[cat] += s
    spent = sum(total.values())
    # the GPU-seconds the window's samples need at full batch (each step at its own rates)
    need = 0.0
    for v in window:
        w = wl.at(v) if wl.schedule is not None else wl
        r = role_rates(w)
        g = w.group_gpus
        need += recs[v]["samples"] * (g / r.rollout + g / r.genrm + g / r.trainer) / g
    fb = fluid_bound(wl)
    paths = [path_gaps(recs[v]) for v in window]
    rate = (sum(recs[v]["samples"] for v in window)
            / (recs[-1]["time_s"] - recs[0]["time_s"])) if len(recs) > 1 else None
    return {
        "workload": wl.name, "gpus": wl.gpus, "planner": planner, "split": split.as_dict(),
        "steps": len(recs), "samples_per_s": None if rate is None else round(rate, 3),
        "nonclairvoyant_bound": round(fb["nonclairvoyant_samples_per_s"], 3),
        "fraction_of_nonclairvoyant": None if rate is None else round(
            rate / fb["nonclairvoyant_samples_per_s"], 4),
        "work_share": round(need / spent, 4) if spent else None,
        "gpu_time_share": {k: round(v / spent, 4) for k, v in sorted(total.items())},
        "step_times_s": [round(r["time_s"], 1) for r in recs],
        "path_s": {"per_step": paths, "mean": {
            k: round(sum(p[k] for p in paths) / len(paths), 3) for k in paths[0]} if paths else {}},
        "shifts": len(res.shifts), "sim_s": round(res.sim_s, 1), "wall_s": round(res.wall_s, 1),
    }


def add_held_run_args(p: argparse.ArgumentParser) -> None:
    """The arguments of a run on a workload file, a drifting one possibly held at one regime
    (bench/sim_tail.py takes the same)."""
    p.add_argument("workload", type=Path)
    p.add_argument("--gpus", type=int, default=None)
    p.add_argument("--planner", default="adaptive")
    p.add_argument("--split", default=None, help="R,J,T (default: the best analytic split)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--at", type=int, default=None,
                   help="a drifting file held at this step's regime (e.g. 5: the late one)")


def held_run(args: argparse.Namespace) -> tuple[Workload, cluster.Split]:
    """The workload (held at ``--at``, scaled to ``--gpus``) and the split to start from."""
    wl = load_workload(args.workload)
    if args.at is not None:
        wl = wl.at(args.at)
    if args.gpus:
        wl = wl.scaled(args.gpus)
    if args.split:
        r, j, t = (int(x) for x in args.split.split(","))
        return wl, cluster.Split(r, j, t)
    return wl, cluster.Split(**rank_splits(wl.at(0) if wl.schedule else wl, top=1)[0][1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_held_run_args(p)
    p.add_argument("--every", type=float, default=1.0, help="virtual seconds between samples")
    args = p.parse_args()
    wl, split = held_run(args)
    print(json.dumps(decompose(wl, args.planner, split, args.steps or wl.steps, args.every)))


if __name__ == "__main__":
    main()
