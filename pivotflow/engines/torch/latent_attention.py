"""DeepSeek-V2's and V3's multi-head latent attention (``ModelConfig.kv_lora_rank``):
``LatentAttention``, the trainer's module under the Hub's names (keys and values expanded per
head, as transformers computes them), and ``PackedLatent``, the engine's packed decoder's
(``kv_cache.py``), which attends in the latent and caches latents only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pivotflow.engines.torch.layers import KVCacheHook, RMSNorm
from pivotflow.engines.torch.linear import Linears
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.engines.torch.rope import apply_rotary
from pivotflow.errors import EngineError

LATENT_NORM_EPS = 1e-6  # (DeepseekV3RMSNorm's default: the latents' norms in transformers)


class LatentAttention(nn.Module):
    """DeepSeek-V3's multi-head latent attention (``ModelConfig.kv_lora_rank``), computed as
    transformers does: each head's key and value expanded from the token's normalised latent
    (``kv_b_proj``), one rotary key of ``qk_rope_head_dim`` shared by all heads, the rotary
    part of q and k last (interleaved pairs turned as DeepSeek lays them out when
    ``rope_interleave``). Serving goes through ``PackedLatent`` (the engine's latent cache):
    a ``cache`` here is an error."""

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
        q_scale: torch.Tensor | None = None,  # (Mistral 4's [B, 1, T, 1], by position)
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
        if q_scale is not None:  # (on the whole query, after rope: rope.query_scale)
            q = q * q_scale.to(q.dtype)
        v = kv[..., nope:]
        if cache is not None:
            raise EngineError("latent attention serves from the engine's latent cache "
                              "(kv_cache.PackedDecoder), not a KVCacheHook")
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
    """A latent attention layer for the packed decoder, in its latent ("weight absorption", as
    DeepSeek's and vLLM's decoders serve it): the engine caches each position's latent and
    rotary key (kv_lora_rank + qk_rope_head_dim, one "head" every query head reads) instead of
    every head's key and value, so a slot's position holds 576 numbers where the expanded
    cache held heads x 384 (DeepSeek-V3: 85x fewer). A head's no-rope query turns into latent
    space through its slice of kv_b_proj (q . k_nope = (q W_UK) . latent), and the attention's
    output, a mix of latents, turns back into values through the other slice (W_UV). On the
    module's own parameters (later loads copy into them)."""

    def __init__(self, attn: LatentAttention, cfg: ModelConfig) -> None:
        self.heads, self.rank = cfg.num_attention_heads, cfg.kv_lora_rank
        self.q_rank = cfg.q_lora_rank
        self.nope, self.v_dim, self.d = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.head_dim
        first = attn.q_a_proj if attn.q_latent else attn.q_proj
        self.first, self.kv_a = (first.weight, first.bias), (attn.kv_a_proj_with_mqa.weight,
                                                              attn.kv_a_proj_with_mqa.bias)
        self.q_b = (attn.q_a_layernorm.weight, attn.q_b_proj.weight) if attn.q_latent else None
        self.kv_norm = attn.kv_a_layernorm.weight
        # kv_b_proj [heads * (nope + v), rank] as views: each head's W_UK [nope, rank] and
        # W_UV [v, rank]
        per_head = attn.kv_b_proj.weight.view(self.heads, self.nope + self.v_dim, self.rank)
        self.w_uk, self.w_uv = per_head[:, : self.nope], per_head[:, self.nope :]

    def qkv(self, h: torch.Tensor, mm: Linears) -> tuple[torch.Tensor, torch.Tensor]:
        """(queries and the cached key [n, heads + 1, rank + rope], values [n, 1, rank +
        rope]) of normalised hidden states ``h`` [n, hidden]: each head's query as its latent
        query and rotary query, the position's latent and rotary key (rope not yet applied);
        its values are the latent itself (the rotary part rides along and is dropped by
        ``output``). The slot cache keeps the keys alone and reads them as the values too:
        their latent part is the same, and the rotary part of a mix of values is dropped."""
        n, heads, rank, nope = h.shape[0], self.heads, self.rank, self.nope
        q = mm.linear(h, *self.first)
        if self.q_b is not None:
            q = mm.linear(torch.rms_norm(q, (self.q_rank,), self.q_b[0], LATENT_NORM_EPS),
                          self.q_b[1])
        q = q.view(n, heads, self.d)
        a = mm.linear(h, *self.kv_a)  # [latent | rotary key]
        qk = h.new_empty(n, heads + 1, a.shape[1])
        qk[:, :heads, :rank] = torch.bmm(q[..., :nope].transpose(0, 1), self.w_uk).transpose(0, 1)
        qk[:, :heads, rank:] = q[..., nope:]
        qk[:, heads, :rank] = torch.rms_norm(a[:, :rank], (rank,), self.kv_norm, LATENT_NORM_EPS)
        qk[:, heads, rank:] = a[:, rank:]
        return qk, qk[:, heads:]  # (the caller turns a copy of qk: these stay unturned)

    def output(self, out: torch.Tensor) -> torch.Tensor:
        """The attention's output [n, heads * (rank + rope)], each head a mix of latents, as
        the heads' values [n, heads * v_head_dim] (what o_proj reads)."""
        n = out.shape[0]
        latents = out.view(n, self.heads, -1)[..., : self.rank].transpose(0, 1)
        return torch.bmm(latents, self.w_uv.transpose(1, 2)).transpose(0, 1).reshape(n, -1)
