"""Group-relative advantage estimators: GRPO (and Dr. GRPO) and RLOO.

Both take the rewards of one group ``[G]`` (the G samples drawn for one prompt) or of many groups
``[N, G]`` and return advantages of the same shape. They are pure tensor functions with no
gradient (rewards are outcomes, not functions of the policy).
"""

from __future__ import annotations

import torch

from pivotflow.errors import RLError

# The list forms of one group (what group functions use) live in list_math.py, which imports no
# torch, so graph files and the controller can use them; re-exported for existing imports.
from pivotflow.rl.list_math import grpo_list, rloo_list

__all__ = ["grpo_advantages", "grpo_list", "rloo_advantages", "rloo_list"]


def _check_rewards(rewards: torch.Tensor, what: str) -> torch.Tensor:
    """Validate a ``[G]`` or ``[N, G]`` reward tensor and return it as floating point, detached."""
    if not isinstance(rewards, torch.Tensor):
        raise RLError(f"{what}: rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if rewards.dim() not in (1, 2):
        raise RLError(f"{what}: rewards must have shape [G] or [N, G], got {tuple(rewards.shape)}")
    group = rewards.shape[-1]
    if group < 2:
        # A group of one has no baseline: its advantage would be identically zero, which is
        # always a configuration mistake (group size 1) rather than a signal.
        raise RLError(
            f"{what}: group size must be >= 2, got {group} (shape {tuple(rewards.shape)})"
        )
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    finite = torch.isfinite(rewards)
    if not bool(finite.all()):
        bad = tuple(int(i) for i in (~finite).nonzero()[0].tolist())
        raise RLError(f"{what}: reward at index {bad} is not finite ({rewards[bad].item()})")
    return rewards.detach()


def grpo_advantages(
    rewards: torch.Tensor, *, normalize_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Group-relative advantages of GRPO, per group along the last dimension.

    GRPO (Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, eq. for outcome supervision)::

        A_i = (r_i - mean(r)) / (std(r) + eps)

    Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783) drops the
    std division, which biases updates toward too-easy and too-hard prompts::

        A_i = r_i - mean(r)                       (normalize_std=False)

    ``std`` is the sample standard deviation with Bessel's correction (``unbiased=True``, divisor
    G - 1). The paper does not say which; we match TRL's ``GRPOTrainer`` and verl's
    ``compute_grpo_outcome_advantage``, which both call ``torch.Tensor.std`` with its default
    (unbiased) so numbers agree with theirs (TRL adds eps=1e-4, verl 1e-6). A group whose rewards
    are all equal gets advantages of exactly 0 in every dtype, never NaN (see ``_shifted``).

    Args:
        rewards: ``[G]`` or ``[N, G]`` rewards; integer tensors are converted to float32.
        normalize_std: divide by the group std (GRPO) or not (Dr. GRPO).
        eps: added to the std before dividing.

    Returns:
        Advantages with the shape of ``rewards``.

    Raises:
        RLError: rewards are not 1-D or 2-D, the group size is below 2, a reward is not finite,
            or ``eps`` is negative.
    """
    if eps < 0:
        raise RLError(f"grpo_advantages: eps must be >= 0, got {eps}")
    r = _shifted(_check_rewards(rewards, "grpo_advantages"))
    centered = r - r.mean(dim=-1, keepdim=True)
    if not normalize_std:
        return centered
    std = r.std(dim=-1, keepdim=True, unbiased=True)
    # With eps == 0 an all-equal group would divide 0 by 0; its advantages are zero by definition.
    return torch.where(std > 0, centered / (std + eps), torch.zeros_like(centered))


def _shifted(r: torch.Tensor) -> torch.Tensor:
    """Rewards minus their group's first reward: the advantages are unchanged (both estimators
    are shift-invariant), but an all-equal group becomes exact zeros, so its mean, std and
    advantages are exactly 0. Without the shift ``[4.2] * 16`` in float32 has a mean one
    rounding off 4.2, a std of ~2e-7 instead of 0, and (r - mean) / (std + eps) gives +-0.32 to
    every sample; a large common offset (1e6 + 0.1) gave +-0.97. The subtraction is exact for
    rewards within a factor of 2 of the first (Sterbenz), so near-equal groups keep their
    digits too."""
    return r - r[..., :1]


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out advantages, per group along the last dimension.

    RLOO (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
    Learning from Human Feedback in LLMs", arXiv:2402.14740; Kool et al. 2019)::

        A_i = r_i - (1 / (G - 1)) * sum_{j != i} r_j  =  G / (G - 1) * (r_i - mean(r))

    Each sample's baseline is the mean of the other G - 1 samples of its group, so the baseline
    does not depend on the sample itself and the estimate stays unbiased.

    Args:
        rewards: ``[G]`` or ``[N, G]`` rewards, G >= 2; integer tensors are converted to float32.

    Returns:
        Advantages with the shape of ``rewards``.

    Raises:
        RLError: rewards are not 1-D or 2-D, the group size is below 2, or a reward is not finite.
    """
    r = _shifted(_check_rewards(rewards, "rloo_advantages"))
    group = r.shape[-1]
    others_mean = (r.sum(dim=-1, keepdim=True) - r) / (group - 1)
    return r - others_mean
