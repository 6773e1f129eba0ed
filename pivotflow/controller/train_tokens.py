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
    return any(s.advantage != 0 and valid_tokens(s) > 0 for s in seqs)
