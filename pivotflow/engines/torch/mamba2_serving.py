"""The embedded engine's Mamba2 layers (Granite 4.0-H's).

``PackedMamba2`` runs one layer over right-padded prompts (chunked, the state written at each
prompt's end) or one token per running sequence (the state updated in place), its states in
``linear_states.LinearStates``.
"""

from __future__ import annotations

import torch

from pivotflow.engines.torch.linear import Linears
from pivotflow.engines.torch.linear_states import LinearStates, conv_prefill, conv_step
from pivotflow.engines.torch.mamba2 import Mamba2, gated_group_norm, ssd_chunked, ssd_step


class PackedMamba2:
    """One Mamba2 layer of ``PackedDecoder``: ``prefill`` or ``decode``, both returning the
    gated norm's output [rows, inner width], ``out_proj``'s input."""

    def __init__(self, module: Mamba2, index: int) -> None:
        self.module, self.index = module, index
        self.weight = module.in_proj.weight  # (the gate, x|B|C and the time steps: one matmul)
        self.out_weight = module.out_proj.weight

    def prefill(self, h: torch.Tensor, shape: tuple[int, int], lengths: torch.Tensor,
                start: int, states: LinearStates, mm: Linears) -> torch.Tensor:
        """Rows ``h`` [B * T, hidden] of B right-padded prompts of ``lengths`` [B] going into
        slots ``start..``: their outputs, and each prompt's state at its last real token."""
        m, (b, t) = self.module, shape
        gate, xbc, dt = mm.linear(h, self.weight, m.in_proj.bias).split(m.split, -1)
        conv = conv_prefill(xbc.reshape(b, t, -1), m.conv1d.weight, m.conv1d.bias, lengths,
                            states.conv[self.index, start:start + b])
        xs, bs, cs = m.heads_of(conv)
        # padding neither decays nor writes the state (a time step of 0): each prompt's own
        steps = m.time_steps(dt.reshape(b, t, -1))
        steps = steps * (torch.arange(t, device=h.device) < lengths[:, None])[..., None]
        y, final = ssd_chunked(xs.transpose(1, 2), steps.transpose(1, 2), m.a,
                               bs.transpose(1, 2), cs.transpose(1, 2))
        states.recurrent[self.index, start:start + b] = final
        y = y.transpose(1, 2) + xs * m.D.float()[:, None]
        return self._normed(y.reshape(b * t, -1), gate)

    def decode(self, h: torch.Tensor, states: LinearStates, mm: Linears) -> torch.Tensor:
        """One token for each of slots ``0..n-1`` (rows ``h`` [n, hidden]); their states move
        on by it."""
        m, n = self.module, h.shape[0]
        gate, xbc, dt = mm.linear(h, self.weight, m.in_proj.bias).split(m.split, -1)
        conv = conv_step(xbc, m.conv1d.weight, m.conv1d.bias, states.conv[self.index, :n])
        xs, bs, cs = m.heads_of(conv)
        y = ssd_step(xs, m.time_steps(dt), m.a, bs, cs, states.recurrent[self.index, :n])
        y = y + xs * m.D.float()[:, None]
        return self._normed(y.reshape(n, -1), gate)

    def _normed(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        m = self.module
        return gated_group_norm(y, gate, m.norm.weight, m.groups, m.norm.eps, gate.dtype)
