"""GRPO with a generative reward model on the built-in arithmetic task.

prompt -> rollout (policy generates) -> genrm (the judge writes a verdict, parsed to a reward)
       -> advantage (GRPO within each prompt's group) -> train (clipped policy gradient)

With ``--set graph.kl_coef=0.04`` (GRPO's beta; 0, the default, as in TRL and DAPO) a frozen
copy of the initial policy scores each response on its own pool (``reference``, after the
rollout) and the trainer adds the KL penalty (``kl_estimator``: k3, or k1). With
``graph.lora_rank`` > 0 too, the trainer's frozen base is that reference and no pool is added.
``graph.estimator`` picks the advantage: GRPO's by default, Dr. GRPO's, the group's mean over the
batch's std (TRL's ``scale_rewards="batch"``), RLOO or REINFORCE++.

Run:  pivotflow run graphs/grpo_genrm.py            (knobs: --set graph.KEY=VALUE)
"""

from __future__ import annotations

from pivotflow.graph import Graph
from pivotflow.rl.group_fns import (
    grpo_advantage,
    grpo_advantage_no_std,
    reinforce_pp_advantage,
    reinforce_pp_baseline_advantage,
    rloo_advantage,
)
from pivotflow.tasks.judge_format import judge_prompt, parse_verdict

DEFAULTS = {
    "group_size": 8,
    "groups_per_step": 8,
    # Swept on the BPE built-in models (200 steps, seed 0; gain in task_accuracy, first vs last
    # tenth): 1e-5 +0.143, 2e-5 +0.185, 3e-5 +0.216, 5e-5 +0.186.
    "lr": 3e-5,
    # the rate's schedule (worker/train_config.lr_at): "constant", "cosine" or "linear" decay
    # over the run after a linear warm-up of lr_warmup_steps
    "lr_schedule": "constant",
    "lr_warmup_steps": 0,
    "max_tokens": 6,
    "temperature": 1.0,
    "rollout_workers": 1,
    "judge_workers": 1,
    "digits": 2,
    "kl_coef": 0.0,
    "kl_estimator": "k3",
    "reference_workers": 1,
    # AReaL's decoupled loss (worker/train_config.py): the clip around the step's own weights,
    # each token weighted by min(pi / pi_rollout, 2) for the version that sampled it
    "decoupled_loss": False,
    # an entropy bonus (verl's entropy_coeff; 0 as in verl and DAPO): the loss less this times
    # the policy's entropy, which every step records either way (train_entropy)
    "entropy_coef": 0.0,
    # train only the highest-entropy share of each micro-batch's tokens (TRL's
    # top_entropy_quantile, "Beyond the 80/20 rule"; 1: every token)
    "top_entropy_quantile": 1.0,
    # the clipped loss (rl/losses.policy_loss): PPO's clip range, DAPO's clip-higher, and GSPO
    # with importance_sampling_level=sequence (its paper clips at 3e-4 / 4e-4 and averages
    # each sequence's tokens: aggregation=seq-mean-token-mean)
    "clip_eps": 0.2,
    "clip_eps_high": 0.2,
    "aggregation": "token-mean",
    "importance_sampling_level": "token",
    # optimizer updates a step (verl's ppo_mini_batch_size and ppo_epochs, TRL's
    # num_iterations): the batch cut into mini_batches, each an update, passed over epochs times
    "mini_batches": 1,
    "epochs": 1,
    # trainers (a data-parallel group; the planner may add more) and how they hold AdamW's
    # state: zero_stage 0 whole on each, 1 sharded over them (worker/group_adam.py)
    "trainer_workers": 1,
    "zero_stage": 0,
    # LoRA (worker/lora.py; verl's lora_rank and lora_alpha): 0 trains every weight; r > 0 a
    # rank-r update of each linear layer, merged into every published policy (lr: LoRA is
    # usually trained at a larger rate than the full model)
    "lora_rank": 0,
    "lora_alpha": 16.0,
    # the advantage (verl's and OpenRLHF's advantage_estimator): "grpo", "grpo_no_std" (Dr.
    # GRPO), "grpo_batch_std" (the group's mean, the step's std: TRL's scale_rewards="batch"),
    # "rloo", "reinforce_pp" and "reinforce_pp_baseline" (REINFORCE++, per-token returns
    # whitened over the batch; the first needs no groups). PPO with a critic: ppo_genrm.py
    "estimator": "grpo",
}

# estimator -> (a group function, or a per-sample one: the stage kind it needs)
ESTIMATORS = {
    "grpo": ("group", grpo_advantage),
    "grpo_no_std": ("group", grpo_advantage_no_std),
    # the group's mean, the batch's std (TRL's scale_rewards="batch"; LitePPO): Dr. GRPO's
    # advantage, which the step divides by its rewards' std (g.train's batch_std)
    "grpo_batch_std": ("group", grpo_advantage_no_std),
    "rloo": ("group", rloo_advantage),
    "reinforce_pp": ("map", reinforce_pp_advantage()),
    "reinforce_pp_baseline": ("group", reinforce_pp_baseline_advantage()),
}


def judge_template(prompt: str, response: str, **_: object) -> str:
    """What the GenRM reads: the question with the policy's answer, e.g. "47+38=84?"."""
    return judge_prompt(prompt, response)


def parse(verdict: str, **_: object) -> float | None:
    """The GenRM's text to a reward: "85:Yes" -> 1.0, "85:No" -> 0.0, anything else -> None."""
    return parse_verdict(verdict)


def build(config: dict) -> Graph:
    g = Graph("grpo_genrm")
    g.model("policy", source="builtin:policy")
    g.model("judge", source="builtin:judge")
    g.pool("rollout", workers=config["rollout_workers"])
    g.pool("genrm", workers=config["judge_workers"])
    g.pool("trainer", workers=config["trainer_workers"])
    prompts = g.source("prompts", task="arithmetic", digits=config["digits"],
                       group_size=config["group_size"],
                       groups_per_step=config["groups_per_step"])
    rollout = g.generate("rollout", model="policy", pool="rollout",
                         max_tokens=config["max_tokens"], temperature=config["temperature"])
    genrm = g.judge("genrm", model="judge", pool="genrm", template=judge_template, parse=parse,
                    max_tokens=8)
    if config["estimator"] not in ESTIMATORS:
        raise ValueError(f"graph.estimator must be one of {sorted(ESTIMATORS)}, got "
                         f"{config['estimator']!r}")
    kind, estimator = ESTIMATORS[config["estimator"]]
    stage = g.group if kind == "group" else g.map
    advantage = stage("advantage", estimator, writes=["advantage"])
    train = g.train("train", model="policy", pool="trainer", lr=config["lr"],
                    lr_schedule=config["lr_schedule"], lr_warmup_steps=config["lr_warmup_steps"],
                    kl_coef=config["kl_coef"], kl_estimator=config["kl_estimator"],
                    decoupled_loss=config["decoupled_loss"],
                    entropy_coef=config["entropy_coef"],
                    top_entropy_quantile=config["top_entropy_quantile"],
                    clip_eps=config["clip_eps"], clip_eps_high=config["clip_eps_high"],
                    aggregation=config["aggregation"],
                    importance_sampling_level=config["importance_sampling_level"],
                    lora_rank=config["lora_rank"], lora_alpha=config["lora_alpha"],
                    mini_batches=config["mini_batches"], epochs=config["epochs"],
                    zero_stage=config["zero_stage"],
                    batch_std=config["estimator"] == "grpo_batch_std")
    # (under LoRA the trainer's frozen base is the reference: no reference pool)
    if config["kl_coef"] > 0 and not config["lora_rank"]:
        g.pool("reference", workers=config["reference_workers"])
        reference = g.reference("reference", model="policy", pool="reference")
        g.chain(prompts, rollout, reference, genrm, advantage, train)
    else:
        g.chain(prompts, rollout, genrm, advantage, train)
    return g
