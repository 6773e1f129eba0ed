"""DAPO's recipe on the GenRM graph, each piece a line of it (Yu et al. 2025, arXiv:2503.14476).

prompts -> rollout -> genrm (the judge's verdict, a reward) -> keep groups with signal
        -> overlong penalty -> mask truncated responses -> GRPO advantage -> train

* dynamic sampling: ``has_signal`` drops the groups whose rewards are all equal;
* the soft overlong punishment: ``overlong_penalty`` lowers the reward of a response that runs
  into the last ``buffer`` tokens before the cap (after the filter: the penalty would make every
  group's rewards differ);
* overlong filtering: ``mask_truncated`` leaves a response the cap cut out of the loss;
* clip-higher: ``clip_eps_high`` above ``clip_eps``; token-mean aggregation is the default.

With ``--set graph.decoupled_loss=true`` the trainer uses AReaL's decoupled loss instead of
PPO's clip to the rollout's logprobs (``pivotflow/worker/train_config.py``). The step records
say how many responses the cap cut (``response_clip_ratio``) and ``plots/response_lengths.png``
draws it.

    python examples/dapo.py [--steps 60] [--out runs/dapo]
    pivotflow run examples/dapo.py --set graph.max_tokens=5 --set max_staleness=1
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from pivotflow.graph import Graph
from pivotflow.rl.group_fns import grpo_advantage, has_signal, mask_truncated, overlong_penalty
from pivotflow.tasks.judge_format import stage_parse, stage_template

DEFAULTS = {
    "group_size": 8,
    "groups_per_step": 8,
    "lr": 3e-5,
    "max_tokens": 6,  # the cap: an answer is at most 3 digits and EOS
    "overlong_buffer": 2,  # tokens before the cap where the penalty grows
    "overlong_factor": 0.5,  # the penalty at the cap
    "clip_eps": 0.2,
    "clip_eps_high": 0.28,
    "decoupled_loss": False,
}


def build(config: dict) -> Graph:
    g = Graph("dapo")
    g.model("policy", source="builtin:policy")
    g.model("judge", source="builtin:judge")
    g.pool("rollout", workers=1)
    g.pool("genrm", workers=1)
    g.pool("trainer", workers=1)
    prompts = g.source("prompts", task="arithmetic", group_size=config["group_size"],
                       groups_per_step=config["groups_per_step"])
    rollout = g.generate("rollout", model="policy", pool="rollout",
                         max_tokens=config["max_tokens"])
    genrm = g.judge("genrm", model="judge", pool="genrm", template=stage_template,
                    parse=stage_parse, max_tokens=8)
    signal = g.filter("signal", has_signal)
    overlong = g.group("overlong", overlong_penalty(config["max_tokens"],
                                                    config["overlong_buffer"],
                                                    config["overlong_factor"]),
                       writes=["reward"])
    mask = g.group("mask", mask_truncated, writes=["loss_mask"])
    advantage = g.group("advantage", grpo_advantage, writes=["advantage"])
    train = g.train("train", model="policy", pool="trainer", lr=config["lr"],
                    clip_eps=config["clip_eps"], clip_eps_high=config["clip_eps_high"],
                    decoupled_loss=config["decoupled_loss"])
    g.chain(prompts, rollout, genrm, signal, overlong, mask, advantage, train)
    return g


def main() -> None:
    from pivotflow.run import run

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    result = run(Path(__file__), steps=args.steps,
                 out=args.out or Path(tempfile.mkdtemp(prefix="dapo-")))
    s = result.summary
    steps = [json.loads(line) for line in (result.out / "metrics.jsonl").read_text().splitlines()]
    clipped = sum(r["response_clip_ratio"] * r["samples"] for r in steps)
    print(f"{s['steps']} steps, filtered {s['groups_filtered']} groups, accuracy "
          f"{s['task_accuracy_start']} -> {s['task_accuracy_end']}, "
          f"{clipped:.0f} responses cut at the cap; records in {result.out}")


if __name__ == "__main__":
    main()
