"""Rotary position embeddings as transformers computes them: the inverse frequencies of each
rope type (default, linear, llama3, yarn, longrope's short factors), YaRN's and LongRoPE's
attention factor on cos/sin, partial rotary (the first dimensions of a head turn), the cos/sin
tables, and their application (HF's rotate_half layout); the packed decoder's tables and turn
partners. The trainer's decoder (``model.py``) and the engine's packed one (``kv_cache.py``)
both build their tables here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from pivotflow.engines.torch.model_config import ModelConfig


def plain_inv_freq(head_dim: int, theta: float,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """Unscaled RoPE's inverse frequencies ``theta ** (-2i / head_dim)`` [head_dim / 2]."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    return 1.0 / (theta**exponents)


def rope_inv_freq(cfg: ModelConfig, device: torch.device | str | None = None,
                  dim: int = 0) -> torch.Tensor:
    """Rotary inverse frequencies [head_dim / 2] (float32) for ``cfg``'s rope type, as
    transformers' ``modeling_rope_utils`` computes them (default, linear, llama3, yarn,
    longrope, proportional), over the rotary dimensions (``dim``; 0: ``cfg.rotary_dim``). yarn
    and longrope scale cos/sin afterwards (``rope_attention_factor``)."""
    inv_freq = plain_inv_freq(dim or cfg.rotary_dim, cfg.rope_theta, device)
    if cfg.rope_type == "proportional":
        # (Gemma 4's: the first partial_rotary_factor of a head's frequencies turn, at the
        # whole head's exponents; the others stand still, so their dimensions pass through)
        inv_freq[int(cfg.partial_rotary_factor * len(inv_freq) * 2 // 2):] = 0.0
        return inv_freq / cfg.rope_factor
    if cfg.rope_type == "longrope":  # (the short factors: see ModelConfig.context_limit)
        return inv_freq / torch.tensor(cfg.rope_short_factor, dtype=torch.float32,
                                       device=inv_freq.device)
    if cfg.rope_type == "linear":
        return inv_freq / cfg.rope_factor
    if cfg.rope_type == "yarn":
        return _yarn_inv_freq(cfg, inv_freq)
    if cfg.rope_type == "llama3":
        # Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
        old_len = cfg.rope_original_max_position_embeddings or cfg.max_position_embeddings
        low, high, factor = cfg.rope_low_freq_factor, cfg.rope_high_freq_factor, cfg.rope_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        # (low == high, Llama 4 Scout's: no band between, nothing blended)
        smooth = (old_len / wavelen - low) / (high - low) if high > low else wavelen * 0
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, blended, scaled)
    return inv_freq


def _yarn_inv_freq(cfg: ModelConfig, inv_freq: torch.Tensor) -> torch.Tensor:
    """YaRN's "NTK-by-parts": dimensions that turn more than beta_fast times over the original
    context keep their frequency (extrapolate), those that turn fewer than beta_slow times are
    slowed by ``factor`` (interpolate), and a linear ramp blends the band between."""
    d, base = cfg.rotary_dim, cfg.rope_theta
    old_len = cfg.rope_original_max_position_embeddings or cfg.max_position_embeddings

    def dimension(rotations: float) -> float:  # the dimension that turns `rotations` times
        return d * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dimension(cfg.rope_beta_fast), dimension(cfg.rope_beta_slow)
    if cfg.rope_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width band
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolate = (1 - ramp).to(inv_freq.device)
    return inv_freq / cfg.rope_factor * (1 - extrapolate) + inv_freq * extrapolate


def rope_attention_factor(cfg: ModelConfig) -> float:
    """What cos/sin are multiplied by: YaRN's attention temperature (its paper's
    ``0.1 ln(s) + 1``, or DeepSeek's ratio of two such terms when ``mscale`` and
    ``mscale_all_dim`` are set), LongRoPE's ``sqrt(1 + ln(s) / ln(original))``, unless the
    config gives ``attention_factor``; 1 otherwise."""
    if cfg.rope_type not in ("yarn", "longrope"):
        return 1.0
    if cfg.rope_attention_factor:
        return cfg.rope_attention_factor
    if cfg.rope_type == "longrope":  # (LongRoPE's paper; transformers' default)
        original = cfg.rope_original_max_position_embeddings or cfg.max_position_embeddings
        if cfg.rope_factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(cfg.rope_factor) / math.log(original))

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if cfg.rope_mscale and cfg.rope_mscale_all_dim:
        return mscale(cfg.rope_factor, cfg.rope_mscale) / mscale(
            cfg.rope_factor, cfg.rope_mscale_all_dim)
    return mscale(cfg.rope_factor)


def layer_rope(cfg: ModelConfig, kind: str,
               device: torch.device | str | None = None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, attention factor) of a rope kind (``ModelConfig.rope_kind``):
    plain RoPE at ``sliding_rope_theta`` on "sliding" layers (OLMo-3: YaRN on its full layers
    only), the config's rope on "full" ones."""
    dim = cfg.kind_rotary_dim(kind)
    if kind == "sliding":
        return plain_inv_freq(dim, cfg.sliding_rope_theta, device), 1.0
    return rope_inv_freq(cfg, device, dim), rope_attention_factor(cfg)


def query_scale(cfg: ModelConfig, positions: torch.Tensor,
                kind: str = "full") -> torch.Tensor | None:
    """The query scale at integer ``positions`` (float32, their shape) of a rope kind's layers
    (``ModelConfig.rope_kind``), None without one. Ministral 3's, on every layer:
    1 + beta * log(1 + floor(p / L)), L the original context: 1 within it, growing past it,
    as transformers' Ministral3Attention scales q after rope. Llama 4's, on its NoPE layers
    ("none") alone: 1 + attn_scale * log(1 + floor((p + 1) / floor_scale))."""
    if cfg.attn_scale and kind == "none":
        steps = torch.floor((positions.to(torch.float32) + 1) / cfg.floor_scale)
        return 1 + cfg.attn_scale * torch.log1p(steps)
    if not cfg.llama4_scaling_beta:
        return None
    original = cfg.rope_original_max_position_embeddings or cfg.max_position_embeddings
    blocks = torch.div(positions, original, rounding_mode="floor").to(torch.float32)
    return 1 + cfg.llama4_scaling_beta * torch.log1p(blocks)


def layer_cos_sin(cfg: ModelConfig, kind: str, positions: torch.Tensor,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``rotary_cos_sin`` of a rope kind (``layer_rope``); a NoPE layer's ("none") turns
    nothing: cos 1, sin 0, so ``apply_rotary`` gives q and k back unchanged, exactly."""
    if kind == "none":
        shape = (*positions.shape[:-1], 1, positions.shape[-1], cfg.rotary_dim)
        return (torch.ones(shape, dtype=dtype, device=positions.device),
                torch.zeros(shape, dtype=dtype, device=positions.device))
    inv_freq, factor = layer_rope(cfg, kind, positions.device)
    return rotary_cos_sin(positions, inv_freq, dtype, factor)


def rotary_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape [B, 1, T, R] for integer positions [B, T] (HF's rotate_half layout;
    R = 2 * len(inv_freq), the rotary dimensions),
    computed in float32 from ``rope_inv_freq``, times ``scale`` (``rope_attention_factor``),
    and cast to ``dtype``."""
    freqs = positions.to(torch.float32)[..., None] * inv_freq.to(positions.device)  # [B, T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [B, 1, T, D]
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the first ``cos.shape[-1]`` dimensions of each head (all but with a
    partial_rotary_factor); the rest pass through, as in transformers' Phi-3."""
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    turned = x[..., :r]
    return torch.cat((turned * cos + _rotate_half(turned) * sin, x[..., r:]), dim=-1)


# -- the engine's packed decoder (kv_cache.PackedDecoder): RoPE as x * cos + x[partner] * sin,
# one table row per query and key head, the scores' scale on the query rows --------------------


def turn_partners(cfg: ModelConfig, d: int, device: torch.device | str | None = None,
                  rotary: int = 0) -> torch.Tensor | None:
    """Each of a head's ``d`` dimensions' partner in the turn (its signs in
    ``packed_rope_table``'s sin): half of the rotary dimensions away (rotate_half), or its
    pair's other (interleaved pairs, DeepSeek's); the pass-through ones their own. Latent
    attention turns the last dimensions, the others the first. None when every dimension
    turns in halves (a roll by d / 2). ``rotary``: the rotary dimensions (0: cfg.rotary_dim)."""
    r = rotary or cfg.rotary_dim
    if r == d and not cfg.rope_interleave:
        return None
    turn = (torch.arange(r).view(-1, 2).flip(-1).flatten() if cfg.rope_interleave
            else torch.cat((torch.arange(r // 2, r), torch.arange(r // 2))))
    start = d - r if cfg.latent_attention else 0
    partner = torch.arange(d)
    partner[start : start + r] = turn + start
    return partner.to(device)


def packed_rope_table(cfg: ModelConfig, kind: str, max_len: int, d: int,
                      heads: tuple[int, int], device: torch.device | str,
                      dtype: torch.dtype) -> torch.Tensor:
    """[max_len, cos|sin, query heads + key heads, d] for a rope kind (``heads``: their
    counts); query rows carry the score scale (1/sqrt(D), or Gemma's query_pre_attn_scalar's),
    but where q is normalised after rope (Hunyuan's), which would undo it: its norm carries it
    there (``PackedDecoder._head_norms``)."""
    positions = torch.arange(max_len, device=device)[None]
    cos, sin = layer_cos_sin(cfg, kind, positions, torch.float32)
    cos, sin = cos[0, 0], sin[0, 0]
    r = cos.shape[-1]  # (the rotary dimensions: fewer than D with a partial_rotary_factor)
    if cfg.rope_interleave:  # pair (2i, 2i + 1) turns by frequency i
        cos = cos[:, : r // 2].repeat_interleave(2, -1)
        sin = torch.stack((-sin[:, : r // 2], sin[:, : r // 2]), -1).flatten(-2)
    else:
        sin = sin.clone()
        sin[..., : r // 2] *= -1  # rotate_half(x) * sin == x[partner] * this sin
    if r < d:  # the dimensions that pass through: cos 1, sin 0
        ones, zeros = cos.new_ones(len(cos), d - r), sin.new_zeros(len(sin), d - r)
        last = cfg.latent_attention  # (its rotary dimensions are the last ones)
        cos = torch.cat((ones, cos) if last else (cos, ones), -1)
        sin = torch.cat((zeros, sin) if last else (sin, zeros), -1)
    rope = torch.stack((cos, sin), 1)[:, :, None].repeat(1, 1, sum(heads), 1)
    if not cfg.qk_norm_after_rope:
        rope[:, :, : heads[0]] *= cfg.attention_scale
    scale = query_scale(cfg, positions[0], kind)  # (Ministral 3's, Llama 4's: by position)
    if scale is not None:
        rope[:, :, : heads[0]] *= scale.to(rope.device)[:, None, None, None]
    return rope.to(dtype)
