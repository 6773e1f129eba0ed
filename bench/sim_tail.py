"""The responses a step waits for longest, in a simulated run: how many reach the length cap, and
how fast they decode beside the rest of their worker's batch against alone on a replica.

Issue 24 asks for partial rollouts and over-sampling to cut a step's wait for its longest
responses. Whether anything can be cut depends on what the tail is. In the drifting files'
late regime (median 4000, p99/median 10, cap 16384), about 8% of responses reach the cap. A
group of 16 then holds one with probability 1 - (1 - p)^16, about 0.72. A step cannot train
without most of its groups, so it waits for those capped sequences, and what sets its
generation time is how fast they decode: one token per decode step of the worker that holds
them, the step timed by everything in its batch.

The instrument patches the simulator's generate role (as bench/sim_gap.py patches its worker)
and records each policy sequence's join and end times. For the capped ones that ran their whole
life on one worker (not migrated, not carried), it reports:

* ``per_token_ms``: life over tokens;
* ``alone_per_token_ms``: the same tokens decoded on a replica that holds nothing else (the
  cost model's step with a batch of one at its own context). The ratio is the most a scheduler
  could shorten them by lightening their workers' batches, which costs those workers
  throughput.

``capped_share`` is measured over every finished policy sequence; ``capped_share_expected`` is
the workload's length distribution's (the capped log-normal).

    python bench/sim_tail.py bench/workloads/drift/dense7b_judge32b.toml --at 5 --steps 8

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import pivotflow.sim.cluster as cluster
from pivotflow.sim.sim_roles import SimGenerateRole
from pivotflow.sim.workload import Lengths, Workload

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_gap import add_held_run_args, held_run  # noqa: E402  (a sibling script)


def capped_share(lengths: Lengths) -> float:
    """P(a response reaches the cap) under the capped log-normal the simulator draws from."""
    if lengths.p99_over_median <= 1:
        return 1.0 if lengths.median >= lengths.cap else 0.0
    z = (math.log(lengths.cap) - math.log(lengths.median)) / lengths.sigma
    return 0.5 * math.erfc(z / math.sqrt(2))


class TailProbe:
    """Each policy sequence's life, from the generate roles' ``add`` and ``step``."""

    def __init__(self) -> None:
        self.joined: dict[int, tuple[float, int, int]] = {}  # job -> (time, context, tokens)
        self.finished = 0
        self.capped_all = 0  # finished at the cap, migrated or carried ones too
        self.capped: list[dict[str, float]] = []

    def patch(self) -> Any:
        probe, add, step = self, SimGenerateRole.add, SimGenerateRole.step

        def add_(role: SimGenerateRole, jobs: list[Any]) -> Any:
            out = add(role, jobs)
            if role.model == "policy":
                t = role.engine.t0  # after the joiners' prefill: their first decode step
                for j in jobs:
                    if not j.prefix_ids:  # (a migrated or carried one: its life is split)
                        seq = role.engine.seqs[j.job_id]
                        probe.joined[j.job_id] = (t, seq.ctx0, seq.end - seq.start)
            return out

        def step_(role: SimGenerateRole) -> Any:
            stops = dict(role.stops) if role.model == "policy" else {}
            done = step(role)
            if role.model == "policy":
                now = role.shared.clock()
                probe.finished += len(done)
                for r in done:
                    got = probe.joined.pop(r.job_id, None)
                    if stops.get(r.job_id, True):
                        continue
                    probe.capped_all += 1
                    if got is not None:
                        probe.capped.append(probe.life(role, now, *got))
            return done

        SimGenerateRole.add, SimGenerateRole.step = add_, step_  # type: ignore[method-assign]
        return add, step

    @staticmethod
    def life(role: SimGenerateRole, now: float, t0: float, ctx0: int,
             n: int) -> dict[str, float]:
        k = role.engine.cost.decode(role.engine.model, 1.0)  # a replica holding this one only
        alone = n * (k.base + k.per_seq + k.per_ctx * ctx0) + k.per_ctx * n * (n - 1) / 2
        return {"tokens": n, "life_s": now - t0, "per_token_ms": 1000 * (now - t0) / n,
                "alone_per_token_ms": 1000 * alone / n}


def probe_run(wl: Workload, planner: str, split: cluster.Split, steps: int) -> dict[str, Any]:
    probe = TailProbe()
    saved = probe.patch()
    try:
        res = cluster.simulate(wl, planner, split, steps=steps, wall_limit_s=3000.0)
    finally:
        SimGenerateRole.add, SimGenerateRole.step = saved  # type: ignore[method-assign]
    caps = probe.capped
    # (a drifting run's: the mean over its steps, each step's samples drawn at its regime)
    regimes = [wl.at(k).response for k in range(len(res.records))] if wl.schedule else [wl.response]
    p = statistics.fmean(capped_share(x) for x in regimes)
    g = wl.group_size

    def med(key: str) -> float | None:  # over the capped sequences timed whole
        return round(statistics.median(c[key] for c in caps), 2) if caps else None

    return {
        "workload": wl.name, "gpus": wl.gpus, "planner": planner, "split": split.as_dict(),
        "steps": len(res.records), "cap_last": regimes[-1].cap,
        "capped_share_expected": round(p, 4),
        "groups_with_capped_expected": round(
            statistics.fmean(1 - (1 - capped_share(x)) ** g for x in regimes), 4),
        "capped_share": round(probe.capped_all / probe.finished, 4) if probe.finished else None,
        "capped_whole_life": len(caps),
        "per_token_ms": med("per_token_ms"),
        "alone_per_token_ms": med("alone_per_token_ms"),
        "life_s": med("life_s"),
        "step_times_s": [round(r["time_s"], 1) for r in res.records],
        "sim_s": round(res.sim_s, 1), "wall_s": round(res.wall_s, 1),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_held_run_args(p)
    args = p.parse_args(argv)
    wl, split = held_run(args)
    print(json.dumps(probe_run(wl, args.planner, split, args.steps or wl.steps)))


if __name__ == "__main__":
    main()
