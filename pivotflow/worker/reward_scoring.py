"""A reward model's forward: a sequence classifier (Hugging Face ``*ForSequenceClassification``,
one label) scores each whole sequence at its last token, as transformers does for a
right-padded batch. The score role runs it for a ``reward_model`` stage
(``Graph.reward_model``); tests call it to check a stage's rewards offline.
"""

from __future__ import annotations

import torch

from pivotflow.engines.torch.model import Decoder


def sequence_scores(model: Decoder, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each sequence's ``score`` head at its last real token: ``[B]`` float32 (one label).
    Only the last positions reach the head."""
    hidden = model.hidden_states(batch["ids"], attention_mask=batch["attn"])
    last = batch["attn"].sum(dim=1) - 1
    rows = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    return model.score(rows).float()[:, 0]
