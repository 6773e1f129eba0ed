"""Agentic RL: the policy may call a calculator, reads its result, then answers.

prompt -> rollout (multi-turn: think, call, read the <tool_response>, answer) -> genrm (judges
the final answer) -> advantage (GRPO) -> train (the loss skips prompt and tool tokens)

The built-in tool policy answers 2-digit sums by itself about a third of the time and calls the
calculator on a few prompts (the bootstrap taught the call format, not when to call); with the
tool it is almost always right. RL has to learn to call it.

Run:  pivotflow run graphs/agentic_tools.py
      pivotflow run graphs/agentic_tools.py --set graph.tools=pivotflow.tools.builtin:calculator,mypkg.tools:search
"""

from __future__ import annotations

from pivotflow.graph import Graph
from pivotflow.rl.group_fns import grpo_advantage
from pivotflow.tasks.judge_format import judge_prompt, parse_verdict

DEFAULTS = {
    "group_size": 8,
    "groups_per_step": 8,
    "lr": 2e-5,
    "max_tokens": 96,  # per turn: a call in the Hermes format is 23 tokens (75 characters)
    "max_turns": 3,
    "max_total_tokens": 150,  # the tool policy serves 160 positions; prompts are ~6 tokens
    "temperature": 1.0,
    "rollout_workers": 1,
    "judge_workers": 1,
    "digits": 2,
    "tools": "pivotflow.tools.builtin:calculator",  # comma-separated module:attr paths
    "tool_workers": 1,
    "tool_timeout_s": 2.0,
}


def judge_template(prompt: str, response: str, **_: object) -> str:
    """The GenRM judges the final answer (``response``: the last turn); a template reading
    ``trajectory`` would judge the whole exchange, calls and tool results included."""
    return judge_prompt(prompt, response)


def parse(verdict: str, **_: object) -> float | None:
    return parse_verdict(verdict)


def build(config: dict) -> Graph:
    g = Graph("agentic_tools")
    g.model("policy", source="builtin:tool_policy")
    g.model("judge", source="builtin:judge")
    g.pool("rollout", workers=config["rollout_workers"])
    g.pool("genrm", workers=config["judge_workers"])
    g.pool("trainer", workers=1)
    prompts = g.source("prompts", task="arithmetic", digits=config["digits"],
                       group_size=config["group_size"],
                       groups_per_step=config["groups_per_step"])
    rollout = g.generate("rollout", model="policy", pool="rollout",
                         max_tokens=config["max_tokens"], temperature=config["temperature"],
                         tools=config["tools"], max_turns=config["max_turns"],
                         max_total_tokens=config["max_total_tokens"],
                         tool_pool={"workers": config["tool_workers"],
                                    "timeout_s": config["tool_timeout_s"], "memory_mb": 256})
    genrm = g.judge("genrm", model="judge", pool="genrm", template=judge_template, parse=parse,
                    max_tokens=8)
    advantage = g.group("advantage", grpo_advantage, writes=["advantage"])
    train = g.train("train", model="policy", pool="trainer", lr=config["lr"])
    g.chain(prompts, rollout, genrm, advantage, train)
    return g
