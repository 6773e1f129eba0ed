"""The trainer's settings, typed, with their one default each: what ``Graph.train`` accepts and
the train role reads (``worker/train_role.py``), and the reference role's forward budget.

A graph's ``g.train(..., clip_eps=0.28)`` is checked here when the graph is built, so a
misspelt or ill-typed knob is a one-line error naming the graph file's line and the valid keys
instead of a setting the trainer silently never reads. torch-free: the control plane imports it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pivotflow.defaults import AGGREGATIONS, KL_ESTIMATORS


class TrainConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One optimizer step's knobs (rl/losses.policy_loss's, AdamW's, the micro-batching)."""

    lr: float = 3e-4
    clip_eps: float = 0.2  # PPO's clip range of the importance ratio
    # DAPO's clip-higher: the ratio's upper clip is 1 + clip_eps_high (None: clip_eps; DAPO
    # uses 0.28 with clip_eps 0.2; verl's clip_ratio_high)
    clip_eps_high: float | None = None
    aggregation: str = "token-mean"  # one of AGGREGATIONS (token-mean: DAPO's)
    # AReaL's decoupled loss (rl/losses.policy_loss): the clip around the proximal policy (the
    # weights this step starts from: one optimizer step a batch, so its logprobs are this
    # forward's, no extra pass), each token weighted by min(pi_prox / pi_rollout,
    # behavior_weight_cap) for having been sampled by an older version or another engine.
    # Off: the ratio to the rollout's logprobs is clipped, as in PPO.
    decoupled_loss: bool = False
    behavior_weight_cap: float = 2.0  # (verl's tis_imp_ratio_cap default)
    max_grad_norm: float = 1.0
    micro_batch_tokens: int = 4096  # padded token positions one forward pass holds
    kl_coef: float = 0.0  # GRPO's beta against a reference stage's logprobs
    kl_estimator: str = "k3"  # one of KL_ESTIMATORS
    # an entropy bonus: the loss less entropy_coef x the policy's entropy (verl's entropy_coeff;
    # 0, as in verl and DAPO: the entropy is reported in every step's record either way)
    entropy_coef: float = 0.0
    train_dtype: str = "float32"  # the weights' and AdamW state's dtype (train_role.py says why)

    def __post_init__(self) -> None:
        problems = []
        if not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr}")
        if not 0 < self.clip_eps < 1:
            problems.append(f"clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.clip_eps_high is not None and not 0 < self.clip_eps_high < float("inf"):
            problems.append(f"clip_eps_high must be > 0, got {self.clip_eps_high}")
        if not 0 < self.behavior_weight_cap < float("inf"):
            problems.append(f"behavior_weight_cap must be > 0, got {self.behavior_weight_cap}")
        if self.aggregation not in AGGREGATIONS:
            problems.append(f"aggregation must be one of {list(AGGREGATIONS)}, got "
                            f"{self.aggregation!r}")
        if not self.max_grad_norm > 0:
            problems.append(f"max_grad_norm must be > 0, got {self.max_grad_norm}")
        if self.micro_batch_tokens < 1:
            problems.append(f"micro_batch_tokens must be >= 1, got {self.micro_batch_tokens}")
        if not 0 <= self.kl_coef < float("inf"):
            problems.append(f"kl_coef must be a number >= 0, got {self.kl_coef}")
        if not 0 <= self.entropy_coef < float("inf"):
            problems.append(f"entropy_coef must be a number >= 0, got {self.entropy_coef}")
        if self.kl_estimator not in KL_ESTIMATORS:
            problems.append(f"kl_estimator must be one of {list(KL_ESTIMATORS)}, got "
                            f"{self.kl_estimator!r}")
        if problems:
            raise ValueError("; ".join(problems))


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
