"""The trainer's forward from a ``pack``ed batch to each response token's log-probability, and
the policy's entropy there: the train role's and the reference role's, so both score a token the
same way.

Memory. At Qwen2.5's 152k vocabulary the output head's logits are most of a training step's
activations: 4096 positions are 2.5 GB a copy in float32, and a step held several (the logits,
their float32 cast, the log-softmax, and as many gradients in the backward pass). Two things
keep them small:

* The head runs on the response tokens only. The hidden states are gathered before it, where
  the logits of every position, prompt and padding included, used to be computed and gathered
  after it.
* With ``chunk`` > 0 the head, log-softmax and target pick run ``chunk`` positions at a time,
  and nothing vocabulary-wide is kept for the backward pass: ``ChunkedHeadScore`` computes each
  chunk's logits again there and writes their gradient by hand into one weight-gradient
  buffer (Liger's fused linear cross-entropy writes it in the forward pass instead, which needs
  the loss's gradient then; a clipped surrogate's is known only in backward). A step holds one
  chunk's vocabulary-wide tensors, for one more head matmul. Autograd through a checkpointed
  chunk was tried first: it kept one weight-sized gradient per chunk in flight, so at
  Qwen2.5-0.5B's width it held more than the whole logits it saved. Without autograd (the
  reference role) chunks cost nothing extra.

``bench/train_memory.py`` measures what each saves and costs.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from pivotflow.engines.torch.feedforward import LoadBalance
from pivotflow.engines.torch.model import Decoder, entropy_detached, entropy_of, pick_targets

# Response positions whose vocabulary-wide probabilities one pass of the entropy metric holds
# (a 152k vocabulary: 19 MB in float32; taken whole, 4096 positions would be 2.5 GB more).
ENTROPY_CHUNK = 32

# "grad": in the autograd graph (an entropy bonus in the loss); "report": computed detached,
# only reported; "none": not computed (the reference role).
EntropyMode = Literal["grad", "report", "none"]


def response_hidden(model: Decoder, batch: dict[str, torch.Tensor],
                    balance: LoadBalance | None = None) -> torch.Tensor:
    """The final hidden state that scores each response token: ``[B, T, H]`` (position ``p``
    predicts token ``p + 1``; ``batch["gather"]`` holds each response token's position).
    ``balance``: a mixture of experts' load-balancing terms, collected on the way."""
    # (a mixture of experts with routing replay: the rollout's experts, ``train_role.pack``)
    hidden = model.hidden_states(batch["ids"], attention_mask=batch["attn"],
                                 routing=batch.get("routing"), balance=balance)
    pos = batch["gather"].unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
    return hidden.gather(1, pos)


def response_logits(model: Decoder, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The logits that score each response token: ``[B, T, V]``, whole (tests and tools; the
    trainer never holds them all, see ``response_logprobs_entropy``)."""
    return model.lm_head(response_hidden(model, batch))


def score_positions(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                    entropy: EntropyMode) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) and the entropy ([N] float32 each) at ``N`` positions' hidden states
    ``[N, H]``: one head matmul and one log-softmax serve both."""
    logp_all = torch.log_softmax(head(hidden).float(), dim=-1)
    logp = pick_targets(logp_all, targets)
    if entropy == "grad":
        return logp, entropy_of(logp_all)
    if entropy == "report":
        return logp, entropy_detached(logp_all, ENTROPY_CHUNK)
    return logp, None


class ChunkedHeadScore(torch.autograd.Function):
    """log p(target) and the entropy at ``N`` positions from their hidden states ``[N, H]`` and
    the head's weight ``[V, H]``, ``chunk`` positions at a time, keeping only the inputs for the
    backward pass. The gradient of a position's logits ``z`` (``p`` = softmax(z), ``H`` its
    entropy) is ``g_logp * (onehot(target) - p) - g_entropy * p * (log p + H)``; with a
    soft-capped head (Gemma 2's ``cap * tanh(y / cap)`` of the matmul's ``y``, capped in
    float32) times ``1 - tanh(y / cap) ** 2``. Under autocast the matmuls run in its dtype, as
    ``nn.Linear`` would."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk: int, entropy: EntropyMode, cap: float = 0.0,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        kind = hidden.device.type
        ctx.dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
        ctx.chunk, ctx.entropy, ctx.cap = chunk, entropy, cap
        ctx.save_for_backward(hidden, weight, targets)
        logps, entropies = [], []
        with torch.no_grad():
            for start in range(0, hidden.shape[0], chunk):
                logp_all, _ = _chunk_log_softmax(ctx, hidden[start:start + chunk], weight)
                logps.append(pick_targets(logp_all, targets[start:start + chunk]))
                if entropy != "none":
                    entropies.append(entropy_detached(logp_all, ENTROPY_CHUNK))
        logp = torch.cat(logps) if logps else hidden.new_zeros(0, dtype=torch.float32)
        ent = torch.cat(entropies) if entropies else torch.zeros_like(logp)
        if entropy != "grad":
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx: Any, g_logp: torch.Tensor, g_ent: torch.Tensor | None,
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None, None]:
        hidden, weight, targets = ctx.saved_tensors
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        with_entropy = ctx.entropy == "grad" and g_ent is not None
        for start in range(0, hidden.shape[0], ctx.chunk):
            end = start + ctx.chunk
            h = hidden[start:end]
            logp_all, capped = _chunk_log_softmax(ctx, h, weight)
            p = logp_all.exp()
            g = g_logp[start:end, None]
            if with_entropy:
                assert g_ent is not None
                ent = -(p * logp_all).sum(-1, keepdim=True)
                # -p * (g_logp + g_ent * (log p + H)), in place over the log-softmax
                grad_z = logp_all.add_(ent).mul_(g_ent[start:end, None]).add_(g).mul_(p).neg_()
            else:
                grad_z = p.mul_(g).neg_()
            grad_z.scatter_add_(-1, targets[start:end, None], g)  # the onehot(target) term
            if capped is not None:  # through the cap: d(cap tanh(y / cap))/dy = 1 - tanh^2
                grad_z.mul_(capped.square_().neg_().add_(1.0))
            del p, logp_all, capped
            grad_z = grad_z.to(ctx.dtype or weight.dtype)
            if grad_h is not None:
                grad_h[start:end] = grad_z @ _as(ctx, weight)
            if grad_w is not None and grad_z.dtype == grad_w.dtype:
                grad_w.addmm_(grad_z.t(), h)  # in place: no weight-sized temporary per chunk
            elif grad_w is not None:  # (autocast: a half-width product, added as it is cast)
                grad_w.add_(grad_z.t() @ _as(ctx, h))
        return grad_h, grad_w, None, None, None, None


def _as(ctx: Any, t: torch.Tensor) -> torch.Tensor:
    """``t`` in the autocast dtype the forward ran under (else as it is)."""
    return t if ctx.dtype is None else t.to(ctx.dtype)


def _chunk_log_softmax(ctx: Any, h: torch.Tensor,
                       weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The log-softmax of a chunk's logits (float32), and tanh(y / cap) where the head is
    soft-capped (else None)."""
    y = (_as(ctx, h) @ _as(ctx, weight).t()).float()
    if not ctx.cap:
        return torch.log_softmax(y, dim=-1), None
    capped = torch.tanh(y.div_(ctx.cap))
    return torch.log_softmax(capped * ctx.cap, dim=-1), capped


def response_logprobs_entropy(model: Decoder, batch: dict[str, torch.Tensor],
                              entropy: EntropyMode, chunk: int = 0,
                              balance: LoadBalance | None = None,
                              ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each response token's log-probability and the entropy there (``[B, T]`` float32, 0 at
    the padding past a response's end; the entropy None for ``"none"``), ``chunk`` positions
    through the head at a time (0: all of them at once). The padding never reaches the head."""
    hidden = response_hidden(model, batch, balance)
    b, t, width = hidden.shape
    rows = batch["valid"].reshape(-1).nonzero().squeeze(1)
    hidden_rows = hidden.reshape(-1, width).index_select(0, rows)
    target_rows = batch["targets"].reshape(-1).index_select(0, rows)
    if chunk > 0:
        if model.config.logits_scaling != 1.0:  # (Granite's: h / s through W is logits / s)
            hidden_rows = hidden_rows / model.config.logits_scaling
        logp, ent = ChunkedHeadScore.apply(hidden_rows, model.lm_head.weight, target_rows,
                                           chunk, entropy, model.config.final_logit_softcapping)
    else:
        logp, ent = score_positions(model.lm_head, hidden_rows, target_rows, entropy)

    def spread(values: torch.Tensor) -> torch.Tensor:
        """Rows back to their ``[B, T]`` places (index_copy carries the gradient)."""
        full = torch.zeros(b * t, dtype=torch.float32, device=hidden.device)
        return full.index_copy(0, rows, values).reshape(b, t)

    return spread(logp), (None if entropy == "none" or ent is None else spread(ent))


def response_logprobs(model: Decoder, batch: dict[str, torch.Tensor],
                      chunk: int = 0) -> torch.Tensor:
    """log p(response token) under ``model``: ``[B, T]`` float32 (the reference role's
    forward, the trainer's without the entropy)."""
    return response_logprobs_entropy(model, batch, "none", chunk)[0]
