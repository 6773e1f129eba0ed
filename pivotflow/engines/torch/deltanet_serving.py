"""The embedded engine's gated DeltaNet layers (Qwen3.5's linear attention).

``PackedDeltaNet`` runs one layer over right-padded prompts (chunked, the state written at
each prompt's end) or one token per running sequence (the state updated in place), its states
in ``linear_states.LinearStates``.
"""

from __future__ import annotations

import torch

from pivotflow.engines.torch.gated_deltanet import (
    GatedDeltaNet,
    gated_delta_chunked,
    gated_delta_step,
    gated_rms_norm,
)
from pivotflow.engines.torch.linear import Linears, pack_linears
from pivotflow.engines.torch.linear_states import LinearStates, conv_prefill, conv_step


class PackedDeltaNet:
    """One linear layer of ``PackedDecoder``: its four input projections as one matmul (the
    module's weights become views of it: loads are seen), then ``prefill`` or ``decode``.
    Both return the gated norm's output [rows, value dim], ``out_proj``'s input."""

    def __init__(self, module: GatedDeltaNet, index: int) -> None:
        self.module, self.index = module, index
        self.weight, _ = pack_linears([module.in_proj_qkv, module.in_proj_z, module.in_proj_b,
                                       module.in_proj_a])
        heads = module.v_heads
        self.split = [module.conv_dim, heads * module.dv, heads, heads]
        self.out_weight = module.out_proj.weight

    def prefill(self, h: torch.Tensor, shape: tuple[int, int], lengths: torch.Tensor,
                start: int, states: LinearStates, mm: Linears) -> torch.Tensor:
        """Rows ``h`` [B * T, hidden] of B right-padded prompts of ``lengths`` [B] going into
        slots ``start..``: their outputs, and each prompt's state at its last real token."""
        m, (b, t) = self.module, shape
        mixed, z, rate, decay = mm.linear(h, self.weight).split(self.split, -1)
        conv = conv_prefill(mixed.reshape(b, t, -1), m.conv1d.weight, None, lengths,
                            states.conv[self.index, start:start + b])
        q, k, v = m.heads_of(conv)
        g, beta = m.decay_and_rate(decay.reshape(b, t, -1), rate.reshape(b, t, -1))
        # padding neither decays nor writes the state: it is each prompt's own at its end
        real = (torch.arange(t, device=h.device) < lengths[:, None])[..., None]
        g, beta = g * real, beta * real
        out, final = gated_delta_chunked(q.transpose(1, 2), k.transpose(1, 2),
                                         v.transpose(1, 2), g.transpose(1, 2),
                                         beta.transpose(1, 2))
        states.recurrent[self.index, start:start + b] = final
        return self._normed(out.transpose(1, 2).reshape(b * t, m.v_heads, m.dv), z)

    def decode(self, h: torch.Tensor, states: LinearStates, mm: Linears) -> torch.Tensor:
        """One token for each of slots ``0..n-1`` (rows ``h`` [n, hidden]); their states move
        on by it."""
        m, n = self.module, h.shape[0]
        mixed, z, rate, decay = mm.linear(h, self.weight).split(self.split, -1)
        conv = conv_step(mixed, m.conv1d.weight, None, states.conv[self.index, :n])
        q, k, v = m.heads_of(conv)
        g, beta = m.decay_and_rate(decay, rate)
        out = gated_delta_step(q, k, v, g, beta, states.recurrent[self.index, :n])
        return self._normed(out, z)

    def _normed(self, out: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Outputs [rows, value heads, value dim] (float32) through the gated norm."""
        m, rows = self.module, out.shape[0]
        normed = gated_rms_norm(out.to(z.dtype), z.reshape(rows, m.v_heads, m.dv),
                                m.norm.weight, m.norm.eps)
        return normed.reshape(rows, -1)
