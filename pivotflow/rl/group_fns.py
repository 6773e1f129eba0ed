"""Group functions for graphs: advantages and filters over one prompt's group of samples.

They take sample fields by name (lists over the group) and ``**_`` for the rest, as every stage
function does. A sample whose reward is None (a failed judgement) gets advantage 0: it adds no
gradient, and the failure is already counted by the controller.
"""

from __future__ import annotations

from typing import Any

from pivotflow.rl.list_math import grpo_list, rloo_list


def _with_failures(reward: list[float | None], fn: Any) -> dict[str, list[float]]:
    scored = [(i, r) for i, r in enumerate(reward) if r is not None]
    adv = [0.0] * len(reward)
    if len(scored) >= 2:
        for (i, _), a in zip(scored, fn([float(r) for _, r in scored]), strict=True):
            adv[i] = a
    return {"advantage": adv}


def grpo_advantage(reward: list[float | None], **_: Any) -> dict[str, list[float]]:
    """GRPO: (r - mean) / (std + eps) within the group."""
    return _with_failures(reward, grpo_list)


def grpo_advantage_no_std(reward: list[float | None], **_: Any) -> dict[str, list[float]]:
    """Dr. GRPO: r - mean within the group (no std normalisation)."""
    return _with_failures(reward, lambda r: grpo_list(r, normalize_std=False))


def rloo_advantage(reward: list[float | None], **_: Any) -> dict[str, list[float]]:
    """RLOO: r_i minus the mean of the other samples' rewards."""
    return _with_failures(reward, rloo_list)


def has_signal(reward: list[float | None], **_: Any) -> bool:
    """Keep a group only if its rewards differ (DAPO's dynamic sampling): an all-equal group
    has zero advantages and teaches nothing."""
    scored = {r for r in reward if r is not None}
    return len(scored) > 1
