"""GRPO with the task's exact rule as the reward (no judge): the rule-based baseline.

prompt -> rollout -> reward (exact checker) -> advantage (GRPO) -> train
"""

from __future__ import annotations

from pivotflow.graph import Graph
from pivotflow.rl.group_fns import grpo_advantage
from pivotflow.tasks.arithmetic import check_answer

DEFAULTS = {
    "group_size": 8,
    "groups_per_step": 8,
    "lr": 1e-5,
    "max_tokens": 6,
    "temperature": 1.0,
    "rollout_workers": 1,
    "digits": 2,
    # AdamW's state: 0 whole on each trainer, 1 sharded over them (worker/group_adam.py)
    "zero_stage": 0,
}


def exact_reward(answer: str, completion: str, **_: object) -> float:
    """1.0 when the completion is exactly the answer, else 0.0 (TRL-style reward function)."""
    return 1.0 if check_answer(answer, completion) else 0.0


def build(config: dict) -> Graph:
    g = Graph("grpo_rule")
    g.model("policy", source="builtin:policy")
    g.pool("rollout", workers=config["rollout_workers"])
    g.pool("trainer", workers=1)
    prompts = g.source("prompts", task="arithmetic", digits=config["digits"],
                       group_size=config["group_size"],
                       groups_per_step=config["groups_per_step"])
    rollout = g.generate("rollout", model="policy", pool="rollout",
                         max_tokens=config["max_tokens"], temperature=config["temperature"])
    reward = g.map("reward", exact_reward, writes=["reward"])
    advantage = g.group("advantage", grpo_advantage, writes=["advantage"])
    train = g.train("train", model="policy", pool="trainer", lr=config["lr"],
                    zero_stage=config["zero_stage"])
    g.chain(prompts, rollout, reward, advantage, train)
    return g
