"""What every attention layer shares: the KV cache it asks of an engine, and the RMSNorm of
every family (``model.py``'s decoder, ``latent_attention.py``'s latent attention)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

if TYPE_CHECKING:
    from pivotflow.engines.torch.model_config import ModelConfig


class KVCacheHook(Protocol):
    """What an attention layer asks of a KV cache (the engine owns the implementation)."""

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Store new keys/values [B, Hkv, T, D]; return all keys, values and an attention mask."""
        ...


class RMSNorm(nn.Module):
    """Llama's RMSNorm; ``offset`` (Gemma 2's and 3's): scaled by ``1 + weight`` (weights start
    at 0), in float32, rounded to the input dtype after the scaling, not before; ``in_float``
    (Gemma 4's): by ``weight``, likewise in float32; ``centered`` (Cohere 2's): a LayerNorm
    without a bias, the mean removed before, scaled in float32."""

    def __init__(self, dim: int | tuple[int, ...], eps: float, offset: bool = False,
                 in_float: bool = False, centered: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))
        self.eps, self.offset = eps, offset
        self.in_float, self.centered = in_float or offset or centered, centered

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # As transformers does: normalise in float32, round to the input dtype, then scale.
        dtype = x.dtype
        x32 = x.float()
        if self.centered:  # (Cohere 2's LayerNorm without a bias: the mean removed first)
            x32 = x32 - x32.mean(-1, keepdim=True)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.in_float:
            return (x32 * (float(self.offset) + self.weight.float())).to(dtype)
        return self.weight * x32.to(dtype)


def layer_norm(cfg: ModelConfig, dim: int | tuple[int, ...]) -> RMSNorm:
    """An RMSNorm of ``dim`` as ``cfg``'s family computes its norms (Gemma's in float32); a
    weight of shape (heads, head_dim) for heads of q or k with a weight each (Command R+'s)."""
    return RMSNorm(dim, cfg.rms_norm_eps, cfg.norm_offset, cfg.architecture == "gemma4_text",
                   cfg.centered_norm)
