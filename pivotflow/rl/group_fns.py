"""Group functions for graphs: advantages and filters over one prompt's group of samples.

They take sample fields by name (lists over the group) and ``**_`` for the rest, as every stage
function does. A sample whose reward is None (a failed judgement) gets advantage 0: it adds no
gradient, and the failure is already counted by the controller.
"""

from __future__ import annotations

from collections.abc import Callable
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


def overlong_penalty(max_tokens: int, buffer_tokens: int,
                     factor: float = 1.0) -> Callable[..., dict[str, list[float | None]]]:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13; verl's
    ``overlong_buffer``), as a group function that rewrites ``reward``: a response longer than
    ``max_tokens - buffer_tokens`` loses ``factor`` times the share of the buffer it ran into,
    down to ``-factor`` at ``max_tokens`` (and past it). Put it after the reward and before the
    advantage::

        g.group("overlong", overlong_penalty(4096, 512), writes=["reward"])

    As responses grow over a run, more of them reach the cap (``response_clip_ratio`` in the
    step records); this makes the policy pay for the length before the cap cuts it, without
    treating a cut response as wrong. A failed judgement (reward None) stays None. A multi-turn
    response counts its observation tokens too."""
    if not 1 <= buffer_tokens <= max_tokens:
        raise ValueError(f"overlong_penalty: buffer_tokens must be in [1, max_tokens={max_tokens}]"
                         f", got {buffer_tokens}")
    if not 0 <= factor < float("inf"):
        raise ValueError(f"overlong_penalty: factor must be >= 0, got {factor}")
    expected = max_tokens - buffer_tokens

    def overlong(reward: list[float | None], response_ids: list[list[int]],
                 **_: Any) -> dict[str, list[float | None]]:
        out: list[float | None] = []
        for r, ids in zip(reward, response_ids, strict=True):
            over = max(0, len(ids) - expected) / buffer_tokens
            out.append(None if r is None else r - factor * min(1.0, over))
        return {"reward": out}

    overlong.__name__ = f"overlong_penalty({max_tokens}, {buffer_tokens}, {factor})"
    return overlong


def mask_truncated(finish_reason: list[str | None], response_ids: list[list[int]],
                   **fields: Any) -> dict[str, list[list[int]]]:
    """DAPO's overlong filtering, as a group function that writes ``loss_mask``: a response the
    length limit cut (``finish_reason`` "length") is left out of the loss, so a truncated answer
    is neither rewarded nor punished for where the cut fell; the others keep their mask (a
    multi-turn one its observation zeros). Put it before the train stage::

        g.group("mask", mask_truncated, writes=["loss_mask"])

    Its tokens count nowhere in the step (``train_tokens``): with token-mean aggregation the
    rest of the batch is averaged without them."""
    masks = fields.get("loss_mask") or [None] * len(response_ids)
    out = []
    for reason, ids, mask in zip(finish_reason, response_ids, masks, strict=True):
        keep = mask if mask else [1] * len(ids)
        out.append([0] * len(ids) if reason == "length" else list(keep))
    return {"loss_mask": out}
