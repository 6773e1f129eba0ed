"""A reward model's forward: a sequence classifier (Hugging Face ``*ForSequenceClassification``,
one label) scores each whole sequence at its last token, as transformers does for a
right-padded batch. The score role runs it for a ``reward_model`` stage
(``Graph.reward_model``); ``bench`` and tests call it to check a stage's rewards offline.
"""

from __future__ import annotations

import torch

from pivotflow.engines.torch.model import Decoder


def pad_sequences(seqs: list[list[int]], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded ids ``[B, T]`` and their attention mask (1 = a real token)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        attn[i, : len(s)] = 1
    return {"ids": ids, "attn": attn}


def sequence_scores(model: Decoder, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each sequence's ``score`` head at its last real token: ``[B]`` float32 (one label).
    Only the last positions reach the head."""
    hidden = model.hidden_states(batch["ids"], attention_mask=batch["attn"])
    last = batch["attn"].sum(dim=1) - 1
    rows = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    return model.score(rows).float()[:, 0]
