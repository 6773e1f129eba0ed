"""The 5-stage graph the control-plane benches share: prompts -> rollout -> judge -> reward (map)
-> advantage (group) -> train, for workers that do no model work (``--set engine=echo``).
``--set graph.async_reward=true`` makes the reward an ``async def`` (the same arithmetic,
awaited as a task of the controller's loop: what an async stage costs the controller)."""

from __future__ import annotations

from pathlib import Path

TEMPLATE = '''
from pivotflow.graph import Graph
from pivotflow.rl.group_fns import grpo_advantage

DEFAULTS = {"group_size": %(group_size)d, "groups_per_step": %(groups_per_step)d,
            "async_reward": False}

def template(prompt, response, **_):
    return prompt + response + "?"

def parse(verdict, **_):
    return 1.0

def reward(reward, answer, completion, **_):
    return reward * float(answer == completion)

async def reward_awaited(reward, answer, completion, **_):
    return reward * float(answer == completion)

def build(c):
    g = Graph(%(name)r)
    g.model("policy", source=%(policy)r)
    g.model("judge", source=%(judge)r)
    g.pool("rollout", workers=1)
    g.pool("judge", workers=1)
    g.pool("trainer", workers=1)
    src = g.source("prompts", task="arithmetic", group_size=c["group_size"],
                   groups_per_step=c["groups_per_step"])
    gen = g.generate("rollout", model="policy", pool="rollout", max_tokens=4)
    jud = g.judge("judge", model="judge", pool="judge", template=template, parse=parse,
                  max_tokens=2)
    rew = g.map("reward", reward_awaited if c["async_reward"] else reward, writes=["reward"])
    adv = g.group("advantage", grpo_advantage, writes=["advantage"])
    tr = g.train("train", model="policy", pool="trainer")
    g.chain(src, gen, jud, rew, adv, tr)
    return g
'''


def write_echo_graph(path: Path, *, name: str, policy: Path, judge: Path, group_size: int,
                     groups_per_step: int) -> Path:
    """Write the graph file with these models and default group sizes; returns ``path``."""
    path.write_text(TEMPLATE % {"name": name, "policy": str(policy), "judge": str(judge),
                                "group_size": group_size, "groups_per_step": groups_per_step})
    return path
