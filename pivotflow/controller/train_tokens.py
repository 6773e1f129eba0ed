"""How many tokens of a training sequence the loss counts: one definition for the controller,
which sizes each step's totals, and the trainers, which scale their shard's loss by them.

It lives here, away from the trainer, because the controller must not import torch (the trainer
module does): counting is plain list arithmetic.
"""

from __future__ import annotations

from pivotflow.protocol import TrainSeq


def valid_tokens(s: TrainSeq) -> int:
    """Response tokens the loss mask keeps (all of them when the sequence has no mask)."""
    return sum(s.loss_mask) if s.loss_mask else len(s.response_ids)


def seq_tokens(s: TrainSeq) -> int:
    """Tokens a train step reads for the sequence: its prompt and its response (what the
    controller balances shards by and the planner times a step by)."""
    return len(s.prompt_ids) + len(s.response_ids)


def carries_signal(seqs: list[TrainSeq]) -> bool:
    """Whether a step's batch moves the policy: some sequence the loss counts has a nonzero
    advantage. A sequence the mask leaves out carries none, whatever its advantage
    (``rl.group_fns.mask_truncated`` may leave out every one that had signal), and Adam stepped
    on a batch without signal would still move every weight along its stale momentum."""
    return any(valid_tokens(s) > 0 and (any(a != 0 for a in s.token_advantages)
                                        if s.token_advantages else s.advantage != 0)
               for s in seqs)


def whiten_token_advantages(seqs: list[TrainSeq]) -> None:
    """Per-token advantages (GAE's) of a step's whole batch less their mean, over their
    standard deviation, counted over the tokens the loss keeps (verl's ``masked_whiten``,
    unbiased variance, eps 1e-8 inside the root; OpenRLHF normalises GAE's the same way). The
    controller does it before the batch is cut into shards, so every rank sees the batch's
    figures. Sequences that carry one advantage (a group's) are left as they are."""
    kept = [a for s in seqs if s.token_advantages
            for a, m in zip(s.token_advantages, s.loss_mask or [1] * len(s.token_advantages),
                            strict=True) if m]
    if len(kept) < 2:
        return
    mean = sum(kept) / len(kept)
    var = sum((a - mean) ** 2 for a in kept) / (len(kept) - 1)
    scale = 1.0 / (var + 1e-8) ** 0.5
    for s in seqs:
        if s.token_advantages:
            s.token_advantages = [(a - mean) * scale for a in s.token_advantages]


def scale_by_batch_std(seqs: list[TrainSeq], rewards: list[float | None]) -> float | None:
    """Each sequence's one advantage over the standard deviation of the step's rewards
    (``rewards``, None for a failed reward: left out), as TRL's ``scale_rewards="batch"``:
    unbiased, eps 1e-4 added to it. Per-token advantages are left as they are. Returns the
    standard deviation, or None with fewer than two rewards (nothing scaled)."""
    kept = [r for r in rewards if r is not None]
    if len(kept) < 2:
        return None
    mean = sum(kept) / len(kept)
    std = (sum((r - mean) ** 2 for r in kept) / (len(kept) - 1)) ** 0.5
    for s in seqs:
        if not s.token_advantages:
            s.advantage = s.advantage / (std + 1e-4)
    return std
