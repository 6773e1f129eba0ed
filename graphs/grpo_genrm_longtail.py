"""The GenRM graph with reasoning-length responses: a long tail of a few long generations.

Reasoning RL's response lengths are log-normal with a long tail (p99 about 10x the median);
the tiny task's answers are 3 tokens. A ``budget`` stage draws each sample's length from that
distribution (seeded by the sample, so every planner sees the same lengths) and the rollout
generates exactly that many tokens (no stop before it); the GenRM then reads the whole response.
The models serve a longer context than they were trained on: the compute is real, the words
past the answer are not meant to mean anything. This is the workload of ``bench/elastic.py``.

Drift (issue 24): ``--set graph.schedule=FILE`` names a TOML file whose ``[schedule]`` (the
workload files' schema, pivotflow/sim/schedule.py) moves the median, p99/median and cap over
steps; each sample draws its length at its group's step (``group_id // groups_per_step``), and
the generate stage's cap and the context are the run's largest. The drifting CPU workload of
``bench/elastic.py --drift`` is bench/workloads/cpu_tiny_longtail_drift.toml.

Run:  pivotflow run graphs/grpo_genrm_longtail.py --workers 3
      pivotflow run graphs/grpo_genrm_longtail.py --set graph.schedule=bench/workloads/cpu_tiny_longtail_drift.toml
"""

from __future__ import annotations

from pivotflow.graph import Graph
from pivotflow.rl.group_fns import grpo_advantage
from pivotflow.tasks.judge_format import judge_prompt, parse_verdict
from pivotflow.tasks.length_budget import length_budget, load_length_schedule

DEFAULTS = {
    "group_size": 8,
    "groups_per_step": 8,
    "lr": 1e-5,
    "median_tokens": 24,
    "p99_ratio": 10.0,  # p99 / median of the response length
    "max_tokens": 280,  # the cap
    "context": 320,
    "temperature": 1.0,
    "digits": 2,
    "schedule": "",  # a TOML file with a [schedule] of the lengths over steps; "": none
}
PROMPT_ROOM = 40  # context beyond the longest cap: the prompt (6 tokens), BOS, EOS, with room


def judge_template(prompt: str, response: str, **_: object) -> str:
    return judge_prompt(prompt, response, max_chars=None)  # the whole response, not its start


def parse(verdict: str, **_: object) -> float | None:
    return parse_verdict(verdict)


def build(config: dict) -> Graph:
    g = Graph("grpo_genrm_longtail")
    schedule = load_length_schedule(config["schedule"]) if config["schedule"] else None
    cap = config["max_tokens"]
    context = config["context"]
    if schedule is not None:  # the run's longest cap, and a context to hold it
        cap = int(schedule.max("response_cap_tokens", cap))
        context = max(context, cap + PROMPT_ROOM)
    g.model("policy", source="builtin:policy", context=context)
    g.model("judge", source="builtin:judge", context=context + 16)
    g.pool("rollout", workers=1)
    g.pool("genrm", workers=1)
    g.pool("trainer", workers=1)
    prompts = g.source("prompts", task="arithmetic", digits=config["digits"],
                       group_size=config["group_size"],
                       groups_per_step=config["groups_per_step"])
    budget = g.map("budget", length_budget(config["median_tokens"], config["p99_ratio"],
                                           config["max_tokens"], schedule,
                                           config["groups_per_step"]),
                   writes=["min_tokens", "max_tokens"])
    rollout = g.generate("rollout", model="policy", pool="rollout", max_tokens=cap,
                         temperature=config["temperature"])
    genrm = g.judge("genrm", model="judge", pool="genrm", template=judge_template, parse=parse,
                    max_tokens=8)
    advantage = g.group("advantage", grpo_advantage, writes=["advantage"])
    train = g.train("train", model="policy", pool="trainer", lr=config["lr"])
    g.chain(prompts, budget, rollout, genrm, advantage, train)
    return g
