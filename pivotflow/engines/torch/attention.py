"""The attention of every family's decoder layer as transformers computes it (``Attention``:
the trainer's, and the engine's where it serves through ``Decoder.forward``; the packed
decoder, ``kv_cache.PackedDecoder``, serves from the same weights), and attention computed
whole where no fused kernel does (``eager_attention``: Gemma 2's soft-capped scores, gpt-oss's
sinks). Latent attention is ``latent_attention``'s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pivotflow.engines.torch.layers import KVCacheHook, RMSNorm, layer_norm
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.engines.torch.rope import apply_rotary

# a layer's keys, values [B, kv heads, S, D] and mask, as it attended over them
_KV = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads = cfg.num_attention_heads
        # (Gemma 4's full layers: heads of their own width and count, values = keys)
        self.n_kv = cfg.layer_kv_heads(layer_idx)
        self.head_dim = cfg.layer_head_dim(layer_idx)
        self.k_eq_v = cfg.layer_k_eq_v(layer_idx)
        # (Gemma 4's KV-sharing layers: another layer's keys and values, no k/v of their own)
        self.kv_source = cfg.kv_source(layer_idx)
        owns_kv = self.kv_source == layer_idx
        bias = cfg.attention_bias
        # Qwen3.5's gate: each head's q_proj rows are its query, then its gate (as many)
        self.output_gate = cfg.attn_output_gate
        q_rows = self.n_heads * self.head_dim * (2 if self.output_gate else 1)
        self.q_proj = nn.Linear(cfg.hidden_size, q_rows, bias=bias)
        if owns_kv:
            self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=bias)
        if owns_kv and not self.k_eq_v:
            self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=bias)
        # Gemma 4's values RMS-normalised per head without a scale (0: not); Llama 4's q and k
        # on its rope layers (after rope there; a rotation keeps a head's RMS, so before it
        # here, as every family's per-head norms)
        self.v_norm_eps = cfg.rms_norm_eps if cfg.value_norm else 0.0
        self.qk_l2_eps = (cfg.rms_norm_eps if cfg.weightless_qk_norm
                          and cfg.rope_kind(layer_idx) != "none" else 0.0)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=cfg.o_proj_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        # Qwen3 and Gemma: one RMSNorm over head_dim, shared by all heads of q (of k); OLMo: one
        # over the whole projection, applied before it is cut into heads
        self.whole_qk_norm = cfg.whole_qk_norm
        self.norm_after_rope = cfg.qk_norm_after_rope
        if cfg.qk_norm:
            q_width: int | tuple[int, int] = self.head_dim
            k_width: int | tuple[int, int] = self.head_dim
            if self.whole_qk_norm:
                q_width, k_width = self.n_heads * self.head_dim, self.n_kv * self.head_dim
            elif cfg.qk_norm_per_head:  # (Command R+'s: a weight for each head)
                q_width, k_width = (self.n_heads, self.head_dim), (self.n_kv, self.head_dim)
            self.q_norm = layer_norm(cfg, q_width)
            if owns_kv:
                self.k_norm = layer_norm(cfg, k_width)
        self.scale = cfg.attention_scale
        self.softcap = cfg.attn_logit_softcapping  # (Gemma 2's; 0: none)
        # gpt-oss's: a learned logit per head that every query's softmax also spreads over
        self.sinks = nn.Parameter(torch.zeros(self.n_heads)) if cfg.attention_sinks else None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn_mask: torch.Tensor | None,
        cache: KVCacheHook | None,
        q_scale: torch.Tensor | None = None,
        shared: dict[int, _KV] | None = None,
    ) -> torch.Tensor:
        """``q_scale`` [B, 1, T, 1]: each position's query scale after rope (Ministral 3's:
        ``rope.query_scale``). ``shared``: the keys, values and mask each layer attended over
        in this pass, by layer (Gemma 4's KV sharing: this layer's are kept there, or taken
        from its source's)."""
        b, t, _ = x.shape
        q = self.q_proj(x)
        if self.kv_source != self.layer_idx:
            assert shared is not None
            return self.o_proj(self._attend_shared(q, cos, sin, shared[self.kv_source]))
        k = self.k_proj(x)
        gate = None
        if self.output_gate:
            q, gate = q.view(b, t, self.n_heads, 2 * self.head_dim).chunk(2, -1)
            q, gate = q.reshape(b, t, -1), gate.reshape(b, t, -1)
        out = self._attend(x, q, k, cos, sin, attn_mask, cache, q_scale, shared)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.o_proj(out)

    def _attend_shared(self, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       source: _KV) -> torch.Tensor:
        """A KV-sharing layer's heads' outputs: its queries (normalised per head, rotated) over
        the keys and values (and mask) its source layer attended over in this pass."""
        b, t, _ = q.shape
        q = q.view(b, t, self.n_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        q = apply_rotary(q.transpose(1, 2), cos, sin)
        k, v, attn_mask = source
        return self._scores(q, k, v, attn_mask, decoding=False)

    def _attend(
        self,
        x: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn_mask: torch.Tensor | None,
        cache: KVCacheHook | None,
        q_scale: torch.Tensor | None = None,
        shared: dict[int, _KV] | None = None,
    ) -> torch.Tensor:
        """The heads' outputs [B, T, heads * head_dim] (o_proj's input) for projected q, k."""
        b, t, _ = x.shape
        k_raw = k
        if self.whole_qk_norm and self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(b, t, self.n_heads, self.head_dim)
        k = k.view(b, t, self.n_kv, self.head_dim)
        per_head = (None if self.whole_qk_norm or self.q_norm is None or self.k_norm is None
                    else (self.q_norm, self.k_norm))
        if per_head is not None and not self.norm_after_rope:
            q, k = per_head[0](q), per_head[1](k)
        if self.qk_l2_eps:  # (Llama 4's)
            q, k = _weightless(q, self.qk_l2_eps), _weightless(k, self.qk_l2_eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.values(x, k_raw).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if q_scale is not None:
            q = q * q_scale.to(q.dtype)
        if per_head is not None and self.norm_after_rope:  # (Hunyuan's: rotated, normalised)
            q, k = per_head[0](q), per_head[1](k)
        if cache is not None:
            k, v, attn_mask = cache.update(self.layer_idx, k, v)
        if shared is not None:  # (a KV-sharing layer attends over these next)
            shared[self.layer_idx] = (k, v, attn_mask)
        return self._scores(q, k, v, attn_mask, decoding=cache is not None)

    def _scores(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attn_mask: torch.Tensor | None, decoding: bool) -> torch.Tensor:
        """Attention of roped queries [B, heads, T, D] over keys and values [B, kv heads, S,
        D] -> [B, T, heads * D] (``decoding``: from an engine's cache)."""
        b, _, t, _ = q.shape
        rep = self.n_heads // self.n_kv
        if self.softcap or self.sinks is not None:  # (no fused kernel caps scores or sinks)
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            out = eager_attention(q, k, v, attn_mask, self.scale, self.softcap, self.sinks)
            return out.transpose(1, 2).reshape(b, t, -1)
        if rep > 1 and t == 1 and decoding:
            # One-token decode: fold each KV group's query heads onto the query axis so cached
            # keys/values are read in place, not copied `rep` times (same math as below).
            out = F.scaled_dot_product_attention(
                q.reshape(b, self.n_kv, rep, self.head_dim), k, v, attn_mask=attn_mask,
                scale=self.scale,
            )
            return out.reshape(b, t, -1)
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if attn_mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1, scale=self.scale)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=self.scale)
        return out.transpose(1, 2).reshape(b, t, -1)


    def values(self, x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """The value heads [B, T, kv heads, head_dim] for input ``x`` [B, T, hidden] and its
        key projection ``k`` [B, T, kv heads * head_dim] (Gemma 4's full layers take their
        values there), normalised without a scale where the family says (Gemma 4's)."""
        b, t, _ = x.shape
        v = (k if self.k_eq_v else self.v_proj(x)).view(b, t, self.n_kv, self.head_dim)
        return _weightless(v, self.v_norm_eps) if self.v_norm_eps else v


def _weightless(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Heads [..., D] RMS-normalised without a weight, in float32, back to their dtype."""
    return F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: torch.Tensor | None, scale: float, cap: float = 0.0,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention computed whole, for what no fused kernel does, as transformers computes it:
    Gemma 2's soft-capped scores, cap * tanh(q.k * scale / cap) before the mask (``cap`` 0:
    none), and gpt-oss's sinks, a logit per head [H] beside each query's masked scores in its
    softmax, whose share goes nowhere. The softmax in float32. ``q`` [..., H, T, D], ``k``/``v``
    [..., H, S, D] (one key head per query head); ``mask`` [..., T, S] boolean (True: attend)
    or additive, or None: causal (top-left aligned, as SDPA's is_causal)."""
    scores = soft_cap(torch.matmul(q, k.transpose(-1, -2)) * scale, cap)
    t, s = scores.shape[-2:]
    if mask is None and t > 1:
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = (scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool
                  else scores + mask)
    if sinks is None:
        return torch.matmul(scores.softmax(-1, dtype=torch.float32).to(v.dtype), v)
    sink = sinks.to(scores.dtype).view(-1, 1, 1).expand(*scores.shape[:-1], 1)
    probs = torch.cat((scores, sink), -1).softmax(-1, dtype=torch.float32)[..., :-1]
    return torch.matmul(probs.to(v.dtype), v)


def soft_cap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap * tanh(logits / cap)`` (Gemma 2's final logits; ``cap`` 0: as they are)."""
    return torch.tanh(logits / cap) * cap if cap else logits
