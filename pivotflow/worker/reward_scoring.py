"""A one-label classifier's forwards (Hugging Face ``*ForSequenceClassification``): a reward
model scores each whole sequence at its last token, as transformers does for a right-padded
batch, and a critic (PPO's value model, the same shape: OpenRLHF starts its critic from a reward
model) scores the state before every response token. The score role runs them for a
``reward_model`` and a ``critic`` stage, and the trainer the critic's with gradients.
"""

from __future__ import annotations

import torch

from pivotflow.engines.torch.model import Decoder
from pivotflow.worker.response_scoring import response_hidden


def sequence_scores(model: Decoder, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each sequence's ``score`` head at its last real token: ``[B]`` float32 (one label).
    Only the last positions reach the head."""
    hidden = model.hidden_states(batch["ids"], attention_mask=batch["attn"])
    last = batch["attn"].sum(dim=1) - 1
    rows = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    return model.score(rows).float()[:, 0]


def response_values(model: Decoder, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The value of the state before each response token of a ``pack``ed batch: ``[B, T]``
    float32, the ``score`` head at the position that predicts the token (the hidden state the
    policy's head reads there), as verl's critic takes its values. Padding positions hold
    whatever the head gives there; the value loss masks them."""
    return model.score(response_hidden(model, batch)).float()[..., 0]
