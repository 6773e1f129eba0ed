"""The feed-forward half of a decoder layer: the dense SwiGLU ``MLP``, and Qwen3-MoE's routed
mixture of experts (``SparseMoE``) with its routing: ``route``, the replayed route of routing
replay (R3), the bytes recorded routing travels as, the one loop that combines a layer's
experts (``add_expert_outputs``, which the engine's ``experts.PackedExperts`` shares), and the
load-balancing loss a trainer may add (``LoadBalance``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from pivotflow.engines.torch.model_config import ModelConfig


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The MLP's gate by HF's ``hidden_act`` name: SiLU (SwiGLU), or Gemma's tanh-GELU (GeGLU)."""
    if name == "gelu_pytorch_tanh":
        return lambda x: F.gelu(x, approximate="tanh")
    return F.silu


class MLP(nn.Module):
    """Gated feed-forward (SwiGLU, or GeGLU for Gemma) of ``size`` hidden units (default: the
    config's intermediate_size)."""

    def __init__(self, cfg: ModelConfig, size: int = 0) -> None:
        super().__init__()
        size = size or cfg.intermediate_size
        self.gate_proj = nn.Linear(cfg.hidden_size, size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, size, bias=False)
        self.down_proj = nn.Linear(size, cfg.hidden_size, bias=False)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def route(
    router_logits: torch.Tensor, top_k: int, normalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's experts and their weights, as Qwen3-MoE routes: softmax over all experts
    in float32, the ``top_k`` largest, optionally renormalised to sum to 1, cast back to the
    logits' dtype. ``router_logits`` [n, experts] -> (weights [n, k], expert ids [n, k])."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), experts


def routing_dtype(num_experts: int) -> torch.dtype:
    """How recorded expert ids travel (``RoutingRecorder``, a sample's ``routing`` bytes): one
    byte each up to 256 experts, else two."""
    return torch.uint8 if num_experts <= 256 else torch.int16


def routing_from_bytes(data: bytes, cfg: ModelConfig) -> torch.Tensor:
    """Recorded routing bytes -> expert ids [positions, sparse layers, k] (int64)."""
    flat = torch.frombuffer(bytearray(data), dtype=routing_dtype(cfg.num_experts))
    return flat.view(-1, cfg.sparse_layers, cfg.num_experts_per_tok).long()


def replayed_route(
    router_logits: torch.Tensor, replay: torch.Tensor, top_k: int, normalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``route`` with the experts given: the rollout engine's choice (rollout routing replay,
    R3: Ma et al. 2025, arXiv:2510.11370), its weights from these logits as ``route`` weighs its
    own choice (softmax over all experts, gathered, optionally renormalised), so the router
    still learns. Rows of ``replay`` [n, k] holding -1 (positions the rollout did not route:
    the last token) take ``route``'s own choice."""
    own_weights, own = route(router_logits, top_k, normalize)
    given = replay[:, 0] >= 0
    if not bool(given.any()):
        return own_weights, own
    experts = torch.where(given[:, None], replay, own)
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights = probs.gather(-1, experts)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), experts


def sort_by_expert(experts: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, list[int]]:
    """The n*k (token, choice) pairs of expert ids [n, k] in expert order, and how many each
    expert got: ``order`` indexes the flattened [n*k] choices (``order // k`` is a pair's token
    row), ``counts[e]`` pairs of expert e follow those of e - 1. One sort and one host sync,
    so each expert then reads a contiguous slice (no per-expert scan or gather)."""
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return order, torch.bincount(flat, minlength=num_experts).tolist()


def add_expert_outputs(
    into: torch.Tensor, h: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor,
    num_experts: int, expert: Callable[[int, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """``into`` [n, H] plus, for each row of ``h`` [n, H], the outputs of its ``chosen``
    experts [n, k] weighed by ``weights`` [n, k], in place; ``expert(e, rows)`` runs expert
    ``e`` on rows [m, H]. Each expert hit runs once, on its contiguous slice of the
    expert-sorted rows (``sort_by_expert``). The trainer's ``SparseMoE`` and the engine's
    ``PackedExperts`` both combine their experts here."""
    order, counts = sort_by_expert(chosen, num_experts)
    rows = order // chosen.shape[-1]
    inputs, parts, start = h[rows], [], 0
    for e, count in enumerate(counts):
        if count:
            parts.append(expert(e, inputs[start:start + count]))
            start += count
    outputs = torch.cat(parts) * weights.reshape(-1)[order, None]
    return into.index_add_(0, rows, outputs.to(into.dtype))


class LoadBalance:
    """The Switch Transformer's load-balancing loss over one forward's sparse layers, as
    transformers' ``load_balancing_loss_func`` pools them (Qwen3-MoE's ``aux_loss``, what
    ``router_aux_loss_coef`` scales): ``E * sum_e f_e * P_e``, where over every sparse layer's
    valid tokens ``f_e`` is the mean number of a token's k choices that went to expert e and
    ``P_e`` the router's mean probability of e. Minimal (k) when routing is uniform. Only P
    carries a gradient: it pushes the router off the experts that get more than their share.

    Each sparse layer adds its router logits and the experts it dispatched to (with routing
    replay the rollout's, the load the layer really carried; without, the router's own top k,
    transformers' choice). ``valid`` [n] (1 a real token, 0 padding) weighs the rows."""

    def __init__(self, num_experts: int, valid: torch.Tensor | None = None) -> None:
        self.num_experts, self.valid = num_experts, valid
        self.chosen_sum: torch.Tensor | float = 0.0  # [E]: choices each expert got
        self.prob_sum: torch.Tensor | float = 0.0  # [E]: router probability (differentiable)
        self.rows: torch.Tensor | float = 0.0  # valid tokens summed over layers

    def add(self, router_logits: torch.Tensor, chosen: torch.Tensor) -> None:
        """One sparse layer: ``router_logits`` [n, E], ``chosen`` expert ids [n, k]."""
        probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
        weight = (torch.ones(probs.shape[0], device=probs.device) if self.valid is None
                  else self.valid.reshape(-1).to(probs.device, torch.float32))
        counts = torch.zeros(self.num_experts, device=probs.device).scatter_add_(
            0, chosen.reshape(-1), weight.repeat_interleave(chosen.shape[-1]))
        self.chosen_sum = self.chosen_sum + counts
        self.prob_sum = self.prob_sum + (probs * weight[:, None]).sum(0)
        self.rows = self.rows + weight.sum()

    def loss(self) -> torch.Tensor:
        """The loss (a scalar; 0 when no sparse layer ran)."""
        if isinstance(self.prob_sum, float):
            return torch.zeros(())
        rows = torch.clamp(torch.as_tensor(self.rows), min=1.0)
        return self.num_experts * ((self.chosen_sum / rows) * (self.prob_sum / rows)).sum()


class SparseMoE(nn.Module):
    """Qwen3-MoE's sparse block: a bias-free router ``gate`` over ``num_experts`` SwiGLU
    experts, each token through its ``num_experts_per_tok`` best, their outputs summed with the
    router's weights. Experts are modules of their own (``experts.3.up_proj``), as checkpoints
    name them: transformers 5 fuses them in memory but saves and loads these names.

    Every expert a token picks runs on a gathered batch of its tokens, so compute follows the
    routed tokens (k of E experts per token), not E; the router gets its gradient through the
    weights. The load-balancing loss is the trainer's to ask for (``router_aux_loss_coef``,
    0 by default: transformers adds it only with ``output_router_logits``, off in Qwen3-MoE's
    configs, and verl's FSDP trainer adds none): a ``LoadBalance`` passed in collects it."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.top_k, self.normalize = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(
            MLP(cfg, cfg.moe_intermediate_size) for _ in range(cfg.num_experts)
        )

    def forward(self, x: torch.Tensor, replay: torch.Tensor | None = None,
                balance: LoadBalance | None = None) -> torch.Tensor:
        """``x`` [..., H]; ``replay`` [..., k]: experts to use instead of the router's top k
        (``replayed_route``); ``balance`` collects this layer's load-balancing terms."""
        flat = x.reshape(-1, x.shape[-1])
        logits = self.gate(flat)
        if replay is None:
            weights, chosen = route(logits, self.top_k, self.normalize)
        else:
            weights, chosen = replayed_route(
                logits, replay.reshape(-1, self.top_k), self.top_k, self.normalize
            )
        if balance is not None:
            balance.add(logits, chosen)
        out = add_expert_outputs(torch.zeros_like(flat), flat, weights, chosen,
                                 len(self.experts), lambda e, rows: self.experts[e](rows))
        return out.view_as(x)
