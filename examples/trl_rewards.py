"""Reward functions written for TRL's GRPOTrainer, run unchanged: two functions with weights.

prompts (the built-in sums) -> rollout -> reward (TRL functions, once a group) -> GRPO -> train

    python examples/trl_rewards.py [--steps 60] [--out runs/trl]
    pivotflow run examples/trl_rewards.py --set graph.format_weight=0.5

``accuracy_reward`` and ``format_reward`` below are what a TRL script passes ``GRPOTrainer`` as
``reward_funcs``, with ``reward_weights``: each takes ``completions`` and the dataset's columns
by name (``answer``) as lists and returns one float per completion, or None where it does not
apply. ``trl_reward`` calls both on each prompt's group (``group=True``: TRL calls them on a
batch) and sums them as TRL does. With ``each=True`` each function's reward is a field too:
each step's ``field_means`` in metrics.jsonl holds their means (TRL's ``rewards/<name>/mean``)
and samples.jsonl shows them per sample. ``format_reward`` does not apply to a right answer
(None): it only tells wrong answers apart, the way a TRL format or length reward often
applies to some completions only.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

from pivotflow.graph import Graph
from pivotflow.rl.group_fns import grpo_advantage
from pivotflow.rl.reward_adapters import trl_reward
from pivotflow.tasks.arithmetic import check_answer

DEFAULTS = {"group_size": 8, "groups_per_step": 8, "lr": 1e-5, "format_weight": 0.2}


def accuracy_reward(completions: list[str], answer: list[str], **kwargs: object) -> list[float]:
    """1.0 for the right sum (the dataset's ``answer`` column), 0.0 otherwise."""
    return [float(check_answer(a, c)) for c, a in zip(completions, answer, strict=True)]


def format_reward(completions: list[str], answer: list[str],
                  **kwargs: object) -> list[float | None]:
    """For a wrong answer, 1.0 when it is at least a number of the right length (a near miss),
    0.0 when it is not; None for a right one, which ``accuracy_reward`` already rewards."""
    out: list[float | None] = []
    for c, a in zip(completions, answer, strict=True):
        if check_answer(a, c):
            out.append(None)
        else:
            digits = len(str(a))
            out.append(float(re.fullmatch(rf"\s*\d{{{digits}}}\s*", c) is not None))
    return out


def build(config: dict) -> Graph:
    g = Graph("trl_rewards")
    g.model("policy", source="builtin:policy")
    g.pool("rollout", workers=1)
    g.pool("trainer", workers=1)
    prompts = g.source("prompts", task="arithmetic", group_size=config["group_size"],
                       groups_per_step=config["groups_per_step"])
    rollout = g.generate("rollout", model="policy", pool="rollout", max_tokens=6)
    reward = g.group("reward", trl_reward([accuracy_reward, format_reward],
                                          weights=[1.0, config["format_weight"]],
                                          group=True, each=True),
                     writes=["reward", "reward_accuracy_reward", "reward_format_reward"])
    advantage = g.group("advantage", grpo_advantage, writes=["advantage"])
    train = g.train("train", model="policy", pool="trainer", lr=config["lr"])
    g.chain(prompts, rollout, reward, advantage, train)
    return g


def main() -> None:
    from pivotflow.metrics import read_metrics
    from pivotflow.run import run

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="trl-rewards-")) / "run"
    result = run(Path(__file__), steps=args.steps, out=out)
    s = result.summary
    last = read_metrics(result.out / "metrics.jsonl")[-1]["field_means"]
    print(f"{s['steps']} steps: accuracy {s['task_accuracy_start']} -> "
          f"{s['task_accuracy_end']}; the last step's means {last}; records in {result.out}")


if __name__ == "__main__":
    main()
