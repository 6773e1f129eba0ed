"""Group-relative advantages of one group given as a Python list: what group functions get per
prompt (rl/group_fns.py). The same formulas as advantages.py's tensor forms, in float64 without
tensors, since a tensor round trip costs ~50x more than eight floats' math on the controller's hot
path (it runs once per group). Imports no torch: graph files and the controller use it, and
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
