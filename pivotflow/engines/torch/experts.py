"""A sparse (mixture-of-experts) layer on the serving path: ``SparseMoE``'s math on the
experts' weights stacked, ``gate_up`` [E, 2I, H] (one gated matmul per expert) and ``down``.

A step's tokens choose k experts each; the chosen pairs are sorted by expert once and each
expert hit runs once, on its contiguous slice. Decode is bound by streaming the chosen experts'
weights (a 128-unit expert's matmul takes ~36 us on this CPU where its math is ~1 us): padding
every expert's rows to the largest count and running all experts as one batched matmul per
projection measured no faster at 32-64 tokens (5.7 vs 5.3 ms, 6.1 vs 6.4 ms a layer of 64
experts) and 14x slower for one token, so there is one path.

The stacks are the model's own parameters: each expert's ``gate_proj``/``up_proj``/``down_proj``
weight becomes a view into them (``pack_linears``' trick), so a weight load updates both.
"""

from __future__ import annotations

import torch
from torch import nn

from pivotflow.engines.torch.feedforward import (
    MLP,
    SparseMoE,
    add_expert_outputs,
    clamped_glu,
    expert_scaled,
    route,
    router_input,
    router_logits,
    routing_dtype,
)
from pivotflow.engines.torch.linear import Linears
from pivotflow.engines.torch.model import ModelConfig


class RoutingRecorder:
    """Which experts each sequence's tokens went through, for rollout routing replay (R3): per
    slot and position, the k expert ids of every sparse layer ([slots, positions, layers, k],
    ``routing_dtype``). A forward's rows are placed with ``at_prefill``/``at_decode`` before
    it runs; each sparse layer then ``write``s its choice. A position holds the choice of the
    last forward that fed it (a prefix resumed here is prefilled, so recorded, again)."""

    def __init__(self, cfg: ModelConfig, slots: int, positions: int,
                 device: torch.device) -> None:  # fmt: skip
        shape = (slots, positions, cfg.sparse_layers, cfg.num_experts_per_tok)
        self.ids = torch.zeros(shape, dtype=routing_dtype(cfg.num_experts), device=device)
        self._slots = self._positions = torch.zeros(0, dtype=torch.long, device=device)

    def at_prefill(self, start: int, count: int, width: int) -> None:
        """The next forward's rows are ``count`` right-padded sequences of ``width`` from slot
        ``start`` (a padded row's position is overwritten before it is ever read)."""
        device = self.ids.device
        self._slots = torch.arange(start, start + count, device=device).repeat_interleave(width)
        self._positions = torch.arange(width, device=device).repeat(count)

    def at_decode(self, positions: torch.Tensor) -> None:
        """The next forward's rows are slots ``0..n-1`` at ``positions`` [n]."""
        self._slots = torch.arange(positions.shape[0], device=positions.device)
        self._positions = positions

    def write(self, layer: int, chosen: torch.Tensor) -> None:
        self.ids[self._slots, self._positions, layer] = chosen.to(self.ids.dtype)

    def move(self, src: int, dst: int) -> None:
        self.ids[dst] = self.ids[src]

    def read(self, slot: int, fed: int) -> bytes:
        """The first ``fed`` positions of ``slot``, as bytes (``routing_from_bytes`` reads them)."""
        return self.ids[slot, :fed].contiguous().cpu().numpy().tobytes()


class PackedExperts:
    """One sparse layer's router and experts, stacked: ``gate_up`` [E, 2I, H] (each expert's
    gate rows, then its up rows) and ``down`` [E, H, I]; a shared expert (GLM-4.5's, or
    Qwen2-MoE's gated one) packed as a dense MLP."""

    def __init__(self, block: SparseMoE, mm: Linears, sparse_index: int,
                 shared: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        experts = [e for e in block.experts if isinstance(e, MLP)]
        # which sparse layer this is, where a RoutingRecorder (set by the engine) records it
        self.sparse_index = sparse_index
        self.recorder: RoutingRecorder | None = None
        self.gate, self.mm, self.routing = block.gate, mm, block.routing
        self.correction_bias, self.router_norm_eps = block.correction_bias, block.router_norm_eps
        # the shared expert's packed (gate/up, down) weights (the caller packs them as it
        # packs a dense layer's MLP), and Qwen2-MoE's gate on its output
        self.shared = shared
        gate = block.shared_expert_gate
        self.shared_gate = None if gate is None else gate.weight
        self.units, self.count = experts[0].up_proj.weight.shape[0], len(experts)
        # Nemotron-H's experts have no gate: ``gate_up`` is then their up rows alone, and
        # ``act`` (relu(x)^2) their whole activation; the others' gate's (Gemma 4's tanh-GELU)
        self.gated, self.act = experts[0].gated, experts[0].act
        self.gate_up = torch.stack(
            [torch.cat([e.gate_proj.weight, e.up_proj.weight]) if self.gated else e.up_proj.weight
             for e in experts])
        self.down = torch.stack([e.down_proj.weight for e in experts])
        for i, e in enumerate(experts):  # the module's weights become views of the stacks
            if self.gated:
                e.gate_proj.weight = nn.Parameter(self.gate_up[i, : self.units],
                                                  requires_grad=False)
            e.up_proj.weight = nn.Parameter(self.gate_up[i, -self.units:], requires_grad=False)
            e.down_proj.weight = nn.Parameter(self.down[i], requires_grad=False)
        # gpt-oss's experts: biases, stacked the same way, and a clamped gate
        self.limit, self.alpha = experts[0].limit, experts[0].alpha
        self.gate_up_bias = self.down_bias = None
        if self.limit:
            self.gate_up_bias = torch.stack(
                [torch.cat([e.gate_proj.bias, e.up_proj.bias]) for e in experts])
            self.down_bias = torch.stack([e.down_proj.bias for e in experts])
            for i, e in enumerate(experts):
                e.gate_proj.bias = nn.Parameter(self.gate_up_bias[i, : self.units],
                                                requires_grad=False)
                e.up_proj.bias = nn.Parameter(self.gate_up_bias[i, self.units :],
                                              requires_grad=False)
                e.down_proj.bias = nn.Parameter(self.down_bias[i], requires_grad=False)

    def add(self, h: torch.Tensor, x: torch.Tensor,
            route_from: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` [n, H] plus the layer's output for its normed input ``h`` [n, H], in place;
        the router reads ``route_from`` [n, H] where given (Gemma 4's), else ``h``."""
        routed = router_input(self.gate, h if route_from is None else route_from,
                              self.router_norm_eps)
        logits = (router_logits(self.gate, routed, self.routing) if self.routing.biased
                  else self.mm.linear(routed, self.gate.weight, self.gate.bias))  # (sigmoid: fp32)
        weights, chosen = route(logits, self.routing, self.correction_bias)
        weights = expert_scaled(self.gate, weights, chosen)
        if self.recorder is not None:
            self.recorder.write(self.sparse_index, chosen)
        if self.shared is not None:
            gate_up, down = self.shared
            if not self.gated:  # (Nemotron-H's shared expert: up, relu(x)^2, down)
                x = self.mm.linear_add(self.act(self.mm.linear(h, gate_up)), down, None, x)
            elif self.shared_gate is None:
                x = self.mm.linear_add(self.mm.gated(h, gate_up, down.shape[1], self.act), down,
                                       None, x)
            else:
                shared = self.mm.linear(self.mm.gated(h, gate_up, down.shape[1], self.act), down)
                x = x + torch.sigmoid(self.mm.linear(h, self.shared_gate)) * shared
        return add_expert_outputs(x, h, weights, chosen, self.count, self._expert,
                                  self.routing.scales_input)

    def _expert(self, expert: int, rows: torch.Tensor) -> torch.Tensor:
        """Expert ``expert``'s output for ``rows`` [m, H]: one gated matmul, then down."""
        if self.gate_up_bias is not None and self.down_bias is not None:  # (gpt-oss's)
            gate_up = self.mm.linear(rows, self.gate_up[expert], self.gate_up_bias[expert])
            act = clamped_glu(gate_up[:, : self.units], gate_up[:, self.units :], self.limit,
                              self.alpha)
            return self.mm.linear(act, self.down[expert], self.down_bias[expert])
        act = (self.mm.gated(rows, self.gate_up[expert], self.units, self.act) if self.gated
               else self.act(self.mm.linear(rows, self.gate_up[expert])))
        return self.mm.linear(act, self.down[expert])
