"""A custom pipeline built in a script: RLOO advantages with a dynamic-sampling filter.

prompts -> rollout -> reward (exact rule) -> keep groups with signal -> RLOO -> train

    python examples/rloo_filter.py [--steps 20] [--out runs/rloo]

Groups whose rewards are all equal teach nothing (their advantages are all zero); the filter
drops them and the source admits fresh prompts in their place (DAPO's dynamic sampling).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from pivotflow.graph import Graph
from pivotflow.rl.group_fns import has_signal, rloo_advantage
from pivotflow.tasks.arithmetic import check_answer

DEFAULTS = {"group_size": 8, "groups_per_step": 8, "lr": 1e-5}


def exact_reward(answer: str, completion: str, **_: object) -> float:
    return 1.0 if check_answer(answer, completion) else 0.0


def build(config: dict) -> Graph:
    g = Graph("rloo_filter")
    g.model("policy", source="builtin:policy")
    g.pool("rollout", workers=1)
    g.pool("trainer", workers=1)
    prompts = g.source("prompts", task="arithmetic", group_size=config["group_size"],
                       groups_per_step=config["groups_per_step"])
    rollout = g.generate("rollout", model="policy", pool="rollout", max_tokens=6)
    reward = g.map("reward", exact_reward, writes=["reward"])
    keep = g.filter("keep_signal", has_signal)
    advantage = g.group("rloo", rloo_advantage, writes=["advantage"])
    train = g.train("train", model="policy", pool="trainer", lr=config["lr"])
    g.chain(prompts, rollout, reward, keep, advantage, train)
    return g


def main() -> None:
    from pivotflow.run import run

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    result = run(Path(__file__), steps=args.steps,
                 out=args.out or Path(tempfile.mkdtemp(prefix="rloo-")))
    s = result.summary
    print(f"{s['steps']} steps, filtered {s['groups_filtered']} groups, accuracy "
          f"{s['task_accuracy_start']} -> {s['task_accuracy_end']}; records in {result.out}")


if __name__ == "__main__":
    main()
