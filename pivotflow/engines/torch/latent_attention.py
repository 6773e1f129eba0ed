"""DeepSeek-V3's multi-head latent attention (``ModelConfig.kv_lora_rank``): ``LatentAttention``,
the trainer's module under the Hub's names, and ``PackedLatent``, the same projections in the
engine's packed decoder (``kv_cache.py``), which turns them into any family's per-head queries,
keys and values so its slots and attention serve them unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pivotflow.engines.torch.layers import KVCacheHook, RMSNorm
from pivotflow.engines.torch.linear import Linears
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.engines.torch.rope import apply_rotary

LATENT_NORM_EPS = 1e-6  # (DeepseekV3RMSNorm's default: the latents' norms in transformers)


class LatentAttention(nn.Module):
    """DeepSeek-V3's multi-head latent attention (``ModelConfig.kv_lora_rank``), computed as
    transformers does: each head's key and value expanded from the token's normalised latent
    (``kv_b_proj``), one rotary key of ``qk_rope_head_dim`` shared by all heads, the rotary
    part of q and k last (interleaved pairs turned as DeepSeek lays them out when
    ``rope_interleave``). A ``cache`` holds the expanded keys and values (values padded to the
    keys' width), not the latent: the engine's slots hold every head's keys as any family's."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.nope, self.v_dim = cfg.qk_nope_head_dim, cfg.v_head_dim
        self.rank, self.interleave = cfg.kv_lora_rank, cfg.rope_interleave
        hidden, bias, q_width = cfg.hidden_size, cfg.attention_bias, self.n_heads * self.head_dim
        self.q_latent = cfg.q_lora_rank > 0
        if self.q_latent:
            self.q_a_proj = nn.Linear(hidden, cfg.q_lora_rank, bias=bias)
            # (transformers' norms of the latents take their class's default eps, not the
            # config's)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, q_width, bias=False)
        else:
            self.q_proj = nn.Linear(hidden, q_width, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, self.rank + cfg.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(self.rank, self.n_heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.v_dim, hidden, bias=bias)
        self.scale = cfg.attention_scale
        # (what the engine asks of every attention: no sinks, no q/k norms)
        self.sinks, self.q_norm, self.k_norm = None, None, None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn_mask: torch.Tensor | None,
        cache: KVCacheHook | None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        h, d, nope = self.n_heads, self.head_dim, self.nope
        if not self.q_latent:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(b, t, h, d).transpose(1, 2)
        latent, k_rot = self.kv_a_proj_with_mqa(x).split([self.rank, d - nope], -1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(b, t, h, -1).transpose(1, 2)
        turn = interleaved_rotary if self.interleave else apply_rotary
        q = torch.cat((q[..., :nope], turn(q[..., nope:], cos, sin)), -1)
        k_rot = turn(k_rot.view(b, 1, t, d - nope), cos, sin).expand(b, h, t, d - nope)
        k = torch.cat((kv[..., :nope], k_rot), -1)
        v = kv[..., nope:]
        if cache is not None:
            k, v, attn_mask = cache.update(self.layer_idx, k, F.pad(v, (0, d - self.v_dim)))
            v = v[..., : self.v_dim]
        if attn_mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1, scale=self.scale)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=self.scale)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h * self.v_dim))


def interleaved_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on dimensions laid out in interleaved pairs (x0, x1), (x2, x3)... as DeepSeek's
    checkpoints hold them, each pair turned by one frequency; the result de-interleaved (the
    turned firsts, then the seconds), as transformers' ``apply_rotary_pos_emb_interleave``
    gives it (q and k alike, so their product is the pairs' own)."""
    half = cos.shape[-1] // 2
    cos, sin = cos[..., :half], sin[..., :half]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)


class PackedLatent:
    """A latent attention layer's projections for the packed decoder, on the module's own
    parameters (later loads copy into them): ``qkv`` gives every head's query and key [n,
    2 * heads, head_dim] (their rotary part last, not yet turned) and value padded to the keys'
    width [n, heads, head_dim], so the slots and the attention are any family's; ``output``
    drops the padding from the attention's output."""

    def __init__(self, attn: LatentAttention, cfg: ModelConfig) -> None:
        self.heads, self.d, self.rank = cfg.num_attention_heads, cfg.head_dim, cfg.kv_lora_rank
        self.nope, self.v_dim, self.q_rank = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.q_lora_rank
        first = attn.q_a_proj if attn.q_latent else attn.q_proj
        self.first, self.kv_a = (first.weight, first.bias), (attn.kv_a_proj_with_mqa.weight,
                                                              attn.kv_a_proj_with_mqa.bias)
        self.q_b = (attn.q_a_layernorm.weight, attn.q_b_proj.weight) if attn.q_latent else None
        self.kv_norm, self.kv_b = attn.kv_a_layernorm.weight, attn.kv_b_proj.weight

    def qkv(self, h: torch.Tensor, mm: Linears) -> tuple[torch.Tensor, torch.Tensor]:
        """(queries and keys, padded values) of normalised hidden states ``h`` [n, hidden]."""
        n, heads, d, rank, nope = h.shape[0], self.heads, self.d, self.rank, self.nope
        q = mm.linear(h, *self.first)
        if self.q_b is not None:
            q = mm.linear(torch.rms_norm(q, (self.q_rank,), self.q_b[0], LATENT_NORM_EPS),
                          self.q_b[1])
        a = mm.linear(h, *self.kv_a)  # [latent | rotary key]
        kv = mm.linear(torch.rms_norm(a[:, :rank], (rank,), self.kv_norm, LATENT_NORM_EPS),
                       self.kv_b).view(n, heads, nope + self.v_dim)
        qk = h.new_empty(n, 2 * heads, d)
        qk[:, :heads] = q.view(n, heads, d)
        qk[:, heads:, :nope] = kv[..., :nope]
        qk[:, heads:, nope:] = a[:, None, rank:]  # (one rotary key, every head's)
        v = h.new_zeros(n, heads, d)
        v[..., : self.v_dim] = kv[..., nope:]
        return qk, v

    def output(self, out: torch.Tensor) -> torch.Tensor:
        """The attention's output [n, heads * head_dim] without the values' padding."""
        n = out.shape[0]
        return out.view(n, self.heads, self.d)[..., : self.v_dim].reshape(n, -1)
