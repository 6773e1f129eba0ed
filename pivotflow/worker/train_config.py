"""The trainer's settings, typed, with their one default each: what ``Graph.train`` accepts and
the train role reads (``worker/train_role.py``), and the reference role's forward budget.

A graph's ``g.train(..., clip_eps=0.28)`` is checked here when the graph is built, so a
misspelt or ill-typed knob is a one-line error naming the graph file's line and the valid keys
instead of a setting the trainer silently never reads. torch-free: the control plane imports it.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from pivotflow.defaults import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    LORA_LATENT_TARGETS,
    LORA_LINEAR_ATTENTION_TARGETS,
    LORA_TARGETS,
    LR_SCHEDULES,
    RATIO_LEVELS,
)


class TrainConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One optimizer step's knobs (rl/losses.policy_loss's, AdamW's, the micro-batching)."""

    lr: float = 3e-4
    # The learning rate over optimizer steps (``lr_at``; verl's lr_warmup_steps, warmup_style
    # and min_lr_ratio, TRL's lr_scheduler_type): a linear warm-up over lr_warmup_steps, then
    # constant, or a cosine or linear decay to min_lr_ratio x lr at lr_decay_steps (0: the
    # run's steps, filled in by run.role_options). A function of the step alone, so a resumed
    # run or a trainer that joins later takes it up exactly where it was.
    lr_schedule: str = "constant"  # one of LR_SCHEDULES
    lr_warmup_steps: int = 0
    lr_decay_steps: int = 0
    min_lr_ratio: float = 0.0
    clip_eps: float = 0.2  # PPO's clip range of the importance ratio
    # DAPO's clip-higher: the ratio's upper clip is 1 + clip_eps_high (None: clip_eps; DAPO
    # uses 0.28 with clip_eps 0.2; verl's clip_ratio_high)
    clip_eps_high: float | None = None
    # dual-clip PPO: a negative-advantage token's loss at most dual_clip x |A| (verl's
    # clip_ratio_c, 3 by default there; OpenRLHF's dual_clip); None: off
    dual_clip: float | None = None
    aggregation: str = "token-mean"  # one of AGGREGATIONS (token-mean: DAPO's)
    # "token": PPO's ratio per token; "sequence": GSPO's, the geometric mean of a sequence's
    # token ratios, clipped as one (rl/losses.policy_loss; TRL's importance_sampling_level,
    # verl's loss_mode="gspo"; GSPO clips at 3e-4 / 4e-4, not PPO's 0.2)
    importance_sampling_level: str = "token"
    # AReaL's decoupled loss (rl/losses.policy_loss): the clip around the proximal policy (the
    # weights this step starts from: one optimizer step a batch, so its logprobs are this
    # forward's, no extra pass), each token weighted by min(pi_prox / pi_rollout,
    # behavior_weight_cap) for having been sampled by an older version or another engine.
    # Off: the ratio to the rollout's logprobs is clipped, as in PPO.
    decoupled_loss: bool = False
    behavior_weight_cap: float = 2.0  # (verl's tis_imp_ratio_cap default)
    max_grad_norm: float = 1.0
    # Optimizer updates a step: the batch cut into mini_batches parts, one update each, passed
    # over epochs times (verl's train_batch_size / ppo_mini_batch_size and ppo_epochs; TRL's
    # num_mini_batches and num_iterations, GRPO's mu; OpenRLHF's max_epochs). The step still
    # publishes one version; from the second update on the policy differs from the one that
    # sampled, so the clip acts. 1 and 1: one update on the whole batch.
    mini_batches: int = 1
    epochs: int = 1
    micro_batch_tokens: int = 4096  # padded token positions one forward pass holds
    # Memory (worker/response_scoring.py, bench/train_memory.py): recompute each decoder layer
    # in the backward pass instead of keeping its intermediates (verl's
    # enable_gradient_checkpointing), and run the output head over this many response
    # positions at a time, recomputing their logits in the backward pass (0: all at once;
    # verl's entropy_checkpointing). Both trade compute for memory; neither changes the step.
    gradient_checkpointing: bool = False
    logits_chunk_tokens: int = 0
    kl_coef: float = 0.0  # GRPO's beta against a reference stage's logprobs
    kl_estimator: str = "k3"  # one of KL_ESTIMATORS
    # an entropy bonus: the loss less entropy_coef x the policy's entropy (verl's entropy_coeff;
    # 0, as in verl and DAPO: the entropy is reported in every step's record either way)
    entropy_coef: float = 0.0
    # train the surrogate on the top q of each micro-batch's tokens by entropy (TRL's
    # top_entropy_quantile, "Beyond the 80/20 rule"; 1: every token; rl/losses.py says how)
    top_entropy_quantile: float = 1.0
    # a mixture of experts' load-balancing loss (engines/torch/feedforward.LoadBalance,
    # transformers' aux_loss: its router_aux_loss_coef, Qwen3-MoE's configs give 0.001 but
    # leave it off): the loss plus this times it, every forward of the policy. 0, as
    # transformers, verl's FSDP trainer and Qwen3-MoE's configs leave it; slime's Megatron
    # recipes set their own loss on (moe_aux_loss_coeff 1e-3, a per-layer form, see the README)
    router_aux_loss_coef: float = 0.0
    # the weights' and AdamW state's dtype (train_role.py says why); bfloat16 under zero_stage 1
    # keeps float32 master weights and moments beside the bf16 model (worker/sharded_adam.py)
    train_dtype: str = "float32"
    # LoRA (worker/lora.py; verl's and OpenRLHF's lora_rank, lora_alpha, target_modules): 0 trains
    # every weight; r > 0 freezes them and trains a rank-r update of each linear layer named in
    # lora_target_modules, merged into the policy every version publishes
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_target_modules: list[str] = msgspec.field(default_factory=lambda: list(LORA_TARGETS))
    # PPO's critic (a graph's critic stage; Graph.critic): the value model this trainer steps
    # beside the policy on each batch, with an AdamW of its own (critic_model: its store name,
    # filled in by run.role_options from the critic stage, "" without one). critic_lr is
    # verl's critic lr default; value_clip is PPO's clip of the value's move from the one the
    # critic stage gave (verl's cliprange_value and OpenRLHF's value_clip defaults, 0.5; 0:
    # unclipped).
    critic_model: str = ""
    critic_lr: float = 1e-5
    value_clip: float = 0.5
    # the first critic_warmup steps train the critic alone, so the policy's first updates see
    # advantages from a critic that has learned something (verl's trainer.critic_warmup, 0)
    critic_warmup: int = 0
    # LoRA for the critic (verl's critic lora_rank): its body frozen, a rank-r update of the
    # same lora_target_modules trained with its value head whole (PEFT's modules_to_save for a
    # classifier), published merged; 0 trains every weight
    critic_lora_rank: int = 0
    critic_lora_alpha: float = 16.0
    # whiten per-token advantages (GAE's, REINFORCE++'s) over each step's batch: minus their
    # mean, over their standard deviation, over the tokens the loss counts (verl's masked_whiten
    # and OpenRLHF's advantage normalisation; a group's GRPO advantages are already normalised
    # and are left as they are)
    whiten_advantages: bool = True
    # divide each sequence's one advantage by the standard deviation of the step's rewards
    # (TRL's scale_rewards="batch"; "group mean, batch std" in Liu et al. 2025, "Tricks or
    # Traps?", arXiv:2508.08221): with grpo_advantage_no_std, a group without spread keeps 0
    # and a step's few varied groups are not blown up by their own small std. Applied by the
    # controller over the whole batch before it is cut into shards; per-token advantages are
    # whitened instead (above)
    batch_std: bool = False
    # How the trainers' group holds AdamW's state (worker/group_adam.py; DeepSpeed's and
    # OpenRLHF's zero_stage): 0, whole on every trainer; 1, sharded, each of n trainers holding
    # 1/n of it and stepping 1/n of the weights (the same step; 2 and 3, which also shard the
    # gradients and the weights, are not built)
    zero_stage: int = 0

    def __post_init__(self) -> None:
        problems = []
        if not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr}")
        if self.lr_schedule not in LR_SCHEDULES:
            problems.append(f"lr_schedule must be one of {list(LR_SCHEDULES)}, got "
                            f"{self.lr_schedule!r}")
        if self.lr_warmup_steps < 0 or self.lr_decay_steps < 0:
            problems.append("lr_warmup_steps and lr_decay_steps must be >= 0, got "
                            f"{self.lr_warmup_steps} and {self.lr_decay_steps}")
        elif 0 < self.lr_decay_steps <= self.lr_warmup_steps:
            problems.append(f"lr_decay_steps ({self.lr_decay_steps}) must be more than "
                            f"lr_warmup_steps ({self.lr_warmup_steps})")
        if not 0 <= self.min_lr_ratio <= 1:
            problems.append(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not 0 < self.clip_eps < 1:
            problems.append(f"clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.clip_eps_high is not None and not 0 < self.clip_eps_high < float("inf"):
            problems.append(f"clip_eps_high must be > 0, got {self.clip_eps_high}")
        if self.dual_clip is not None and not 1 < self.dual_clip < float("inf"):
            problems.append(f"dual_clip must be > 1, got {self.dual_clip}")
        if not 0 < self.behavior_weight_cap < float("inf"):
            problems.append(f"behavior_weight_cap must be > 0, got {self.behavior_weight_cap}")
        if self.importance_sampling_level not in RATIO_LEVELS:
            problems.append(f"importance_sampling_level must be one of {list(RATIO_LEVELS)}, "
                            f"got {self.importance_sampling_level!r}")
        if self.aggregation not in AGGREGATIONS:
            problems.append(f"aggregation must be one of {list(AGGREGATIONS)}, got "
                            f"{self.aggregation!r}")
        if self.mini_batches < 1 or self.epochs < 1:
            problems.append(f"mini_batches and epochs must be >= 1, got {self.mini_batches} "
                            f"and {self.epochs}")
        if not self.max_grad_norm > 0:
            problems.append(f"max_grad_norm must be > 0, got {self.max_grad_norm}")
        if self.micro_batch_tokens < 1:
            problems.append(f"micro_batch_tokens must be >= 1, got {self.micro_batch_tokens}")
        if self.logits_chunk_tokens < 0:
            problems.append("logits_chunk_tokens must be >= 0 (0: all at once), got "
                            f"{self.logits_chunk_tokens}")
        if not 0 <= self.kl_coef < float("inf"):
            problems.append(f"kl_coef must be a number >= 0, got {self.kl_coef}")
        if not 0 <= self.entropy_coef < float("inf"):
            problems.append(f"entropy_coef must be a number >= 0, got {self.entropy_coef}")
        if not 0 <= self.router_aux_loss_coef < float("inf"):
            problems.append("router_aux_loss_coef must be a number >= 0, got "
                            f"{self.router_aux_loss_coef}")
        if not 0 < self.top_entropy_quantile <= 1:
            problems.append("top_entropy_quantile must be in (0, 1] (1: every token), got "
                            f"{self.top_entropy_quantile}")
        if self.kl_estimator not in KL_ESTIMATORS:
            problems.append(f"kl_estimator must be one of {list(KL_ESTIMATORS)}, got "
                            f"{self.kl_estimator!r}")
        for knob, rank, alpha in (("lora", self.lora_rank, self.lora_alpha),
                                  ("critic_lora", self.critic_lora_rank, self.critic_lora_alpha)):
            if rank < 0:
                problems.append(f"{knob}_rank must be >= 0 (0: no LoRA), got {rank}")
            if not 0 < alpha < float("inf"):
                problems.append(f"{knob}_alpha must be > 0, got {alpha}")
            if rank and self.train_dtype not in ("float32", "fp32"):
                problems.append(f"{knob}_rank needs train_dtype float32, got "
                                f"{self.train_dtype!r} (the merged weights would round the "
                                "adapters' update away: worker/lora.py)")
        known = (*LORA_TARGETS, *LORA_LATENT_TARGETS, *LORA_LINEAR_ATTENTION_TARGETS)
        unknown = [m for m in self.lora_target_modules if m not in known]
        if unknown or not self.lora_target_modules:
            problems.append(f"lora_target_modules must name some of {list(known)}, got "
                            f"{self.lora_target_modules}")
        if not 0 < self.critic_lr < float("inf"):
            problems.append(f"critic_lr must be > 0, got {self.critic_lr}")
        if self.critic_warmup < 0:
            problems.append(f"critic_warmup must be >= 0, got {self.critic_warmup}")
        if not 0 <= self.value_clip < float("inf"):
            problems.append(f"value_clip must be >= 0 (0: unclipped), got {self.value_clip}")
        if self.zero_stage not in (0, 1):
            problems.append(f"zero_stage must be 0 (AdamW's state on every trainer) or 1 (sharded "
                            f"over them), got {self.zero_stage} (2 and 3 are not built)")
        if problems:
            raise ValueError("; ".join(problems))


def lr_at(tc: TrainConfig, step: int) -> float:
    """The learning rate of optimizer step ``step`` (0-based: the policy version it starts
    from). The warm-up's first step takes ``lr / lr_warmup_steps``, not 0 (HF's schedules give
    step 0 a rate of 0, an optimizer step that moves nothing); the decay reaches
    ``min_lr_ratio * lr`` at ``lr_decay_steps`` and stays there."""
    if step < tc.lr_warmup_steps:
        return tc.lr * (step + 1) / tc.lr_warmup_steps
    if tc.lr_schedule == "constant":
        return tc.lr
    if tc.lr_decay_steps <= tc.lr_warmup_steps:
        raise ValueError(f"lr_schedule {tc.lr_schedule!r} needs lr_decay_steps past the "
                         f"warm-up, got {tc.lr_decay_steps}")
    done = min((step - tc.lr_warmup_steps) / (tc.lr_decay_steps - tc.lr_warmup_steps), 1.0)
    left = 0.5 * (1 + math.cos(math.pi * done)) if tc.lr_schedule == "cosine" else 1 - done
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * left)


def train_config(options: dict[str, Any]) -> TrainConfig:
    """The trainer's knobs among a role's options (the rest are the run's: threads, device...)."""
    return msgspec.convert({k: v for k, v in options.items() if k in TrainConfig.__struct_fields__},
                           TrainConfig)


def check_train_options(options: dict[str, Any]) -> TrainConfig:
    """``Graph.train``'s knobs, or ValueError naming each bad one and, for an unknown key, the
    valid ones (msgspec's message, one line)."""
    unknown = sorted(set(options) - set(TrainConfig.__struct_fields__))
    if unknown:
        raise ValueError(f"unknown setting {', '.join(map(repr, unknown))}; valid: "
                         f"{', '.join(TrainConfig.__struct_fields__)}")
    try:
        return msgspec.convert(options, TrainConfig)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from None
