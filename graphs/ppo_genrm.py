"""PPO with a learned critic and a generative reward model on the built-in arithmetic task
(verl's and OpenRLHF's ``advantage_estimator=gae``).

prompt -> rollout (policy generates) -> genrm (the judge's verdict, parsed to a reward)
       -> critic (the value model scores the state before each response token)
       -> gae (per-token advantages and value targets) -> train (policy and critic)

The critic starts from the policy's base with a value head of zeros (verl's way; a reward model's
folder works too, OpenRLHF's), runs on a pool of its own, and is stepped by the trainer beside
the policy: every step publishes a new version of both, and the critic stage scores each
response with the critic of the step it was generated at. No groups are needed, so each prompt
is sampled once (``group_size`` 1) and a step holds ``groups_per_step`` prompts.

With ``--set graph.kl_coef=0.05`` a frozen copy of the initial policy scores each response
(``reference``, on a pool of its own) and every token's reward pays ``kl_coef`` times its KL
estimate (verl's ``use_kl_in_reward``: PPO keeps the KL in the reward, GRPO in the loss).

Run:  pivotflow run graphs/ppo_genrm.py            (knobs: --set graph.KEY=VALUE)
"""

from __future__ import annotations

from pivotflow.graph import Graph
from pivotflow.rl.group_fns import gae_advantage
from pivotflow.tasks.judge_format import stage_parse, stage_template

DEFAULTS = {
    "group_size": 1,
    "groups_per_step": 64,  # the 64 samples a step of grpo_genrm's 8 x 8 trains on
    "lr": 3e-5,  # grpo_genrm's swept rate
    # the critic's rate: verl's default is 1e-5 for billions of weights; on the built-in models
    # (200 steps, seed 0) 1e-5 left the mean value at 0.22 where the returns' was 0.65, 1e-4
    # tracked them (0.57), 1e-3 too; task_accuracy moved little (0.656 / 0.656 / 0.652)
    "critic_lr": 1e-4,
    "value_clip": 0.5,  # verl's cliprange_value (0: unclipped)
    "critic_warmup": 0,  # steps that train the critic alone first (verl's critic_warmup)
    # LoRA (worker/lora.py): the policy's, and the critic's (its value head trains whole)
    "lora_rank": 0,
    "lora_alpha": 16.0,
    "critic_lora_rank": 0,
    "kl_coef": 0.0,  # the KL to the initial policy, in the reward
    "reference_workers": 1,
    "gamma": 1.0,  # verl's and OpenRLHF's defaults for LLM PPO: A_t = R - V_t when both are 1
    "lam": 1.0,
    "whiten_advantages": True,
    "max_tokens": 6,
    "temperature": 1.0,
    "rollout_workers": 1,
    "judge_workers": 1,
    "critic_workers": 1,
    "digits": 2,
    "clip_eps": 0.2,
    "aggregation": "token-mean",
    # optimizer updates a step (verl's ppo_mini_batch_size and ppo_epochs): the batch cut into
    # mini_batches, each an update of the policy and the critic, passed over epochs times
    "mini_batches": 1,
    "epochs": 1,
    # trainers (a data-parallel group; the planner may add more) and how they hold AdamW's
    # state: zero_stage 0 whole on each, 1 sharded over them (worker/group_adam.py)
    "trainer_workers": 1,
    "zero_stage": 0,
}


def build(config: dict) -> Graph:
    g = Graph("ppo_genrm")
    g.model("policy", source="builtin:policy")
    g.model("critic", source="builtin:policy")  # the policy's base, given a value head
    g.model("judge", source="builtin:judge")
    g.pool("rollout", workers=config["rollout_workers"])
    g.pool("genrm", workers=config["judge_workers"])
    g.pool("values", workers=config["critic_workers"])
    g.pool("trainer", workers=config["trainer_workers"])
    prompts = g.source("prompts", task="arithmetic", digits=config["digits"],
                       group_size=config["group_size"],
                       groups_per_step=config["groups_per_step"])
    rollout = g.generate("rollout", model="policy", pool="rollout",
                         max_tokens=config["max_tokens"], temperature=config["temperature"])
    # (grpo_genrm's judge: the question with the answer, "85:Yes" -> 1.0, "85:No" -> 0.0)
    genrm = g.judge("genrm", model="judge", pool="genrm", template=stage_template,
                    parse=stage_parse, max_tokens=8)
    critic = g.critic("critic", model="critic", pool="values")
    gae = g.map("gae", gae_advantage(config["gamma"], config["lam"], config["kl_coef"]),
                writes=["advantage", "returns"])
    train = g.train("train", model="policy", pool="trainer", lr=config["lr"],
                    critic_lr=config["critic_lr"], value_clip=config["value_clip"],
                    critic_warmup=config["critic_warmup"],
                    lora_rank=config["lora_rank"], lora_alpha=config["lora_alpha"],
                    critic_lora_rank=config["critic_lora_rank"],
                    whiten_advantages=config["whiten_advantages"],
                    clip_eps=config["clip_eps"], aggregation=config["aggregation"],
                    mini_batches=config["mini_batches"], epochs=config["epochs"],
                    zero_stage=config["zero_stage"])
    if config["kl_coef"] > 0:
        g.pool("reference", workers=config["reference_workers"])
        reference = g.reference("reference", model="policy", pool="reference")
        g.chain(prompts, rollout, reference, genrm, critic, gae, train)
    else:
        g.chain(prompts, rollout, genrm, critic, gae, train)
    return g
