"""Group-relative advantages of one group given as a Python list: what group functions get per
prompt (rl/group_fns.py). The same formulas as advantages.py's tensor forms, in float64 without
tensors, since a tensor round trip costs ~50x more than eight floats' math on the controller's hot
path (it runs once per group). Also GAE over one response's tokens (``gae_list``), for PPO with a
learned critic. Imports no torch: graph files and the controller use it, and
``pivotflow inspect`` must not pay seconds for torch.
"""

from __future__ import annotations

import math

from pivotflow.errors import RLError


def _check_list(rewards: list[float], what: str) -> None:
    if len(rewards) < 2:
        raise RLError(f"{what}: group size must be >= 2, got {len(rewards)}")
    for i, r in enumerate(rewards):
        if not math.isfinite(r):
            raise RLError(f"{what}: reward at index {i} is not finite ({r})")


def grpo_list(rewards: list[float], *, normalize_std: bool = True,
              eps: float = 1e-6) -> list[float]:
    """``grpo_advantages`` of one group given as a list of floats."""
    _check_list(rewards, "grpo_advantages")
    rewards = [r - rewards[0] for r in rewards]  # an all-equal group is exact zeros (advantages._shifted)
    g = len(rewards)
    mean = sum(rewards) / g
    centered = [r - mean for r in rewards]
    if not normalize_std:
        return centered
    std = math.sqrt(sum(c * c for c in centered) / (g - 1))
    return [c / (std + eps) for c in centered] if std > 0 else [0.0] * g


def rloo_list(rewards: list[float]) -> list[float]:
    """``rloo_advantages`` of one group given as a list of floats."""
    _check_list(rewards, "rloo_advantages")
    rewards = [r - rewards[0] for r in rewards]  # an all-equal group is exact zeros (advantages._shifted)
    total, g = sum(rewards), len(rewards)
    return [r - (total - r) / (g - 1) for r in rewards]


def gae_list(rewards: list[float], values: list[float], gamma: float,
             lam: float) -> tuple[list[float], list[float]]:
    """Generalized advantage estimation over one response: ``(advantages, returns)``.

    Schulman et al. 2016 (arXiv:1506.02438, eq. 16), per response token t, with ``values[t]``
    the critic's V of the state before token t and ``V_T = 0`` after the last token (the episode
    ends there, so nothing is bootstrapped)::

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}     (= sum_l (gamma * lam)^l delta_{t+l})
        R_t     = A_t + V_t                           (the critic's regression target)

    One backward pass, O(T), as verl's ``compute_gae_advantage_return`` and OpenRLHF's
    ``get_advantages_and_returns`` loop it (there over a padded batch; here over one response,
    so there is no mask: every position is a real token). Empty lists give ``([], [])``.

    Raises:
        ValueError: ``rewards`` and ``values`` differ in length.
    """
    if len(rewards) != len(values):
        raise ValueError(f"gae_list: {len(rewards)} rewards for {len(values)} values")
    n = len(rewards)
    advantages, returns = [0.0] * n, [0.0] * n
    next_value, running = 0.0, 0.0  # V_T and A_T: the episode ends after the last token
    for t in range(n - 1, -1, -1):
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
        returns[t] = running + values[t]
        next_value = values[t]
    return advantages, returns
