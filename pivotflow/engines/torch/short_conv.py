"""LFM2's gated short convolutions: the state-keeping layers on most of its layers.

``in_proj`` projects each token into B, C and x (each as wide as the hidden state); B * x goes
through a causal depthwise convolution of ``conv_L_cache`` taps (no activation), and C gates
its output before ``out_proj``. A sequence's memory is the convolution's last taps - 1 inputs
alone, which an engine keeps per slot (``linear_states.LinearStates``). Module and parameter
names are transformers' (``conv.in_proj``, ``conv.conv``, ``conv.out_proj``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pivotflow.engines.torch.linear import Linears
from pivotflow.engines.torch.linear_states import LinearStates, conv_prefill, conv_step
from pivotflow.engines.torch.model_config import ModelConfig


class ShortConv(nn.Module):
    """An LFM2 convolution layer (``conv``) for training and scoring: whole right-padded
    sequences (a padded position comes after every real one: nothing flows back)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        size, taps, bias = cfg.hidden_size, cfg.linear_conv_kernel_dim, cfg.conv_bias
        self.in_proj = nn.Linear(size, 3 * size, bias=bias)
        self.conv = nn.Conv1d(size, size, taps, bias=bias, groups=size, padding=taps - 1)
        self.out_proj = nn.Linear(size, size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        b, c, v = self.in_proj(x).chunk(3, -1)
        w = self.conv.weight
        conv = F.conv1d((b * v).transpose(1, 2), w, self.conv.bias, padding=w.shape[-1] - 1,
                        groups=w.shape[0])[..., :t].transpose(1, 2)
        return self.out_proj(c * conv)


class PackedShortConv:
    """One LFM2 convolution layer of ``PackedDecoder``: ``prefill`` or ``decode``, both
    returning ``out_proj``'s input [rows, hidden]."""

    def __init__(self, module: ShortConv, index: int) -> None:
        self.module, self.index = module, index
        self.weight = module.in_proj.weight
        self.out_weight = module.out_proj.weight

    def prefill(self, h: torch.Tensor, shape: tuple[int, int], lengths: torch.Tensor,
                start: int, states: LinearStates, mm: Linears) -> torch.Tensor:
        """Rows ``h`` [B * T, hidden] of B right-padded prompts of ``lengths`` [B] going into
        slots ``start..``: their outputs, and each prompt's last inputs kept."""
        m, (b, t) = self.module, shape
        bs, cs, xs = mm.linear(h, self.weight, m.in_proj.bias).chunk(3, -1)
        conv = conv_prefill((bs * xs).reshape(b, t, -1), m.conv.weight, m.conv.bias, lengths,
                            states.conv[self.index, start:start + b], silu=False)
        return cs * conv.reshape(b * t, -1)

    def decode(self, h: torch.Tensor, states: LinearStates, mm: Linears) -> torch.Tensor:
        """One token for each of slots ``0..n-1`` (rows ``h`` [n, hidden]); their kept inputs
        move on by it."""
        m, n = self.module, h.shape[0]
        bs, cs, xs = mm.linear(h, self.weight, m.in_proj.bias).chunk(3, -1)
        conv = conv_step(bs * xs, m.conv.weight, m.conv.bias, states.conv[self.index, :n],
                         silu=False)
        return cs * conv
