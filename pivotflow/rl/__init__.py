"""RL math: group-relative advantages and policy-gradient losses (pure tensor functions)."""

from __future__ import annotations

from pivotflow.rl.advantages import grpo_advantages, rloo_advantages
from pivotflow.rl.losses import (
    Aggregation,
    KLEstimator,
    kl_penalty,
    masked_mean,
    masked_sum,
    policy_loss,
)

__all__ = [
    "Aggregation",
    "KLEstimator",
    "grpo_advantages",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "policy_loss",
    "rloo_advantages",
]
