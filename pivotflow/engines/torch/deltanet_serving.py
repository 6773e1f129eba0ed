"""The embedded engine's gated DeltaNet layers (Qwen3.5's linear attention) and what they
keep per sequence in place of keys and values.

A linear layer's memory of a sequence is a fixed-size state, whatever its length: the delta
rule's [value heads, key dim, value dim] matrix (float32, as vLLM and transformers keep it) and
the convolution's last ``taps - 1`` inputs. ``LinearStates`` holds them per slot of the
``SlotKVCache`` that owns it (and moves them with their slot); ``PackedDeltaNet`` runs one
layer over right-padded prompts (chunked, the state written at each prompt's end) or one token
per running sequence (the state updated in place).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pivotflow.engines.torch.gated_deltanet import (
    GatedDeltaNet,
    gated_delta_chunked,
    gated_delta_step,
    gated_rms_norm,
)
from pivotflow.engines.torch.linear import Linears, pack_linears
from pivotflow.engines.torch.model_config import ModelConfig


class LinearStates:
    """Every linear layer's state for each of ``max_batch`` slots: ``conv`` [layers, slots,
    taps - 1, conv channels] in the model's dtype, ``recurrent`` [layers, slots, value heads,
    key dim, value dim] in float32."""

    def __init__(self, cfg: ModelConfig, max_batch: int, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        n, heads = len(cfg.linear_attention_layers), cfg.linear_num_value_heads
        channels = (2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
                    + heads * cfg.linear_value_head_dim)
        self.conv = torch.zeros(n, max_batch, cfg.linear_conv_kernel_dim - 1, channels,
                                device=device, dtype=dtype)
        self.recurrent = torch.zeros(n, max_batch, heads, cfg.linear_key_head_dim,
                                     cfg.linear_value_head_dim, device=device,
                                     dtype=torch.float32)

    def move(self, src: int, dst: int) -> None:
        """Slot ``src``'s states into slot ``dst``."""
        self.conv[:, dst] = self.conv[:, src]
        self.recurrent[:, dst] = self.recurrent[:, src]


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
        taps = m.conv1d.weight.shape[-1]
        # left-padded by taps - 1 zeros: a causal convolution, as taps shifted multiply-adds
        # over [B, T, channels] (a depthwise conv1d wants channels first: two transposes, and
        # was slower on CPU); the state is each prompt's last taps - 1 inputs (zeros before
        # the first)
        padded = F.pad(mixed.reshape(b, t, -1), (0, 0, taps - 1, 0))
        weight = m.conv1d.weight.squeeze(1)  # [channels, taps]
        conv = padded[:, :t] * weight[:, 0]
        for j in range(1, taps):
            conv.addcmul_(padded[:, j:j + t], weight[:, j])
        ends = lengths[:, None] + torch.arange(taps - 1, device=h.device)
        states.conv[self.index, start:start + b] = padded.gather(
            1, ends[..., None].expand(b, taps - 1, padded.shape[-1]))
        q, k, v = m.heads_of(F.silu(conv))
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
        window = torch.cat((states.conv[self.index, :n], mixed[:, None]), 1)  # [n, taps, C]
        states.conv[self.index, :n] = window[:, 1:]
        weight = m.conv1d.weight.squeeze(1)  # [channels, taps]
        conv = F.silu((window.float() * weight.t().float()).sum(1)).to(h.dtype)
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
