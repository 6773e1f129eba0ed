"""What a hybrid model's linear layers keep per sequence in place of keys and values, and the
causal convolution both kinds run before their recurrence.

A linear layer's memory of a sequence is a fixed-size state, whatever its length: the
recurrence's matrix (float32, as vLLM and transformers keep it: a gated DeltaNet's [value
heads, key dim, value dim], a Mamba2 layer's [heads, head dim, state dim]) and the
convolution's last ``taps - 1`` inputs. ``LinearStates`` holds them per slot of the
``SlotKVCache`` that owns it (and moves them with their slot); ``conv_prefill`` and
``conv_step`` run the convolution over prompts or one token, keeping its inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pivotflow.engines.torch.model_config import ModelConfig


class LinearStates:
    """Every linear layer's state for each of ``max_batch`` slots: ``conv`` [layers, slots,
    taps - 1, conv channels] in the model's dtype, ``recurrent`` [layers, slots, *state] in
    float32."""

    def __init__(self, cfg: ModelConfig, max_batch: int, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        n = len(cfg.linear_attention_layers)
        state: tuple[int, ...]
        if cfg.short_conv:  # (LFM2's: the convolution's inputs alone, no recurrence)
            channels, taps, state = cfg.hidden_size, cfg.linear_conv_kernel_dim, (0,)
        elif cfg.mamba:
            groups = cfg.mamba_n_groups * cfg.mamba_d_state
            channels, taps = cfg.mamba_d_inner + 2 * groups, cfg.mamba_d_conv
            state = (cfg.mamba_n_heads, cfg.mamba_d_head, cfg.mamba_d_state)
        else:
            heads = cfg.linear_num_value_heads
            channels = (2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
                        + heads * cfg.linear_value_head_dim)
            taps = cfg.linear_conv_kernel_dim
            state = (heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
        self.conv = torch.zeros(n, max_batch, taps - 1, channels, device=device, dtype=dtype)
        self.recurrent = torch.zeros(n, max_batch, *state, device=device, dtype=torch.float32)

    def move(self, src: int, dst: int) -> None:
        """Slot ``src``'s states into slot ``dst``."""
        self.conv[:, dst] = self.conv[:, src]
        self.recurrent[:, dst] = self.recurrent[:, src]


def conv_prefill(mixed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 lengths: torch.Tensor, kept: torch.Tensor, silu: bool = True) -> torch.Tensor:
    """The causal depthwise convolution (``weight`` [channels, 1, taps], ``bias``) and SiLU
    (``silu``: LFM2's has none) over right-padded prompts ``mixed`` [B, T, channels]; each
    prompt's last taps - 1 inputs (zeros before its first) written to ``kept``
    [B, taps - 1, channels]."""
    b, t, _ = mixed.shape
    taps = weight.shape[-1]
    # left-padded by taps - 1 zeros: a causal convolution, as taps shifted multiply-adds over
    # [B, T, channels] (a depthwise conv1d wants channels first: two transposes, and was
    # slower on CPU)
    padded = F.pad(mixed, (0, 0, taps - 1, 0))
    w = weight.squeeze(1)  # [channels, taps]
    conv = padded[:, :t] * w[:, 0]
    for j in range(1, taps):
        conv.addcmul_(padded[:, j:j + t], w[:, j])
    if bias is not None:
        conv += bias
    ends = lengths[:, None] + torch.arange(taps - 1, device=mixed.device)
    kept.copy_(padded.gather(1, ends[..., None].expand(b, taps - 1, padded.shape[-1])))
    return F.silu(conv) if silu else conv


def conv_step(mixed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              kept: torch.Tensor, silu: bool = True) -> torch.Tensor:
    """One token's convolution and SiLU for each of n sequences (``mixed`` [n, channels]),
    their last inputs ``kept`` [n, taps - 1, channels] moved on by it. float32 sums, rounded
    to ``mixed``'s dtype."""
    window = torch.cat((kept, mixed[:, None]), 1)  # [n, taps, channels]
    kept.copy_(window[:, 1:])
    out = (window.float() * weight.squeeze(1).t().float()).sum(1)
    if bias is not None:
        out += bias.float()
    return (F.silu(out) if silu else out).to(mixed.dtype)
