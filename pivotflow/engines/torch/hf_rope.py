"""RoPE as a Hugging Face ``config.json`` says it, and back: ModelConfig's ``rope_*`` fields
and ``partial_rotary_factor`` (``hf_config`` reads with ``rope_fields``, ``hf_config_write``
writes with ``rope_to_hf``).

transformers 5 writes ``rope_parameters``; older configs ``rope_scaling`` (None for plain
RoPE) next to ``rope_theta``; with both, transformers 5 takes ``rope_scaling``, and so does
pivotflow. Phi-3 alone reads LongRoPE; the families in ``PARTIAL_ROTARY_FAMILIES`` rotate part
of each head.
"""

from __future__ import annotations

from typing import Any

from pivotflow.engines.torch.architectures import ROPE_TYPES
from pivotflow.engines.torch.hf_families import ENGINE, number
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.errors import ModelConfigError

# (transformers' other families turn whole heads)
PARTIAL_ROTARY_FAMILIES = ("phi3", "glm4", "glm4_moe", "qwen3_5_text", "qwen3_5_moe_text",
                           "qwen3_next", "minimax_m2", "solar_open", "gemma4_text")
# the share of each head that rotates where a config names none (Glm4Config's and Glm4MoeConfig's
# half, Qwen3_5TextConfig's quarter; the others' whole head)
_DEFAULT_PARTIAL = {"glm4": 0.5, "glm4_moe": 0.5, "qwen3_5_text": 0.25,
                    "qwen3_5_moe_text": 0.25, "qwen3_next": 0.25}
# (SmolLM3Config's, GptOssConfig's, MiniMaxM2Config's, Ernie4_5Config's, SolarOpenConfig's,
# ApertusConfig's, HYV3Config's, MiniCPM5MoeConfig's; the others' is 10000)
DEFAULT_THETA = {"smollm3": 2000000.0, "gpt_oss": 150000.0, "minimax_m2": 5000000.0,
                 "ernie4_5": 500000.0, "ernie4_5_moe": 500000.0, "solar_open": 1000000.0,
                 "apertus": 12000000.0, "hy_v3": 11158840.0,
                 "minicpm5_moe": 5000000.0}


def rope_key(raw: dict[str, Any]) -> str:
    """Where a config keeps its rope dict: transformers 5 writes ``rope_parameters``, older
    configs ``rope_scaling``; with both, transformers 5 takes ``rope_scaling``."""
    return "rope_scaling" if raw.get("rope_scaling") else "rope_parameters"


def rope_fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """ModelConfig's rope_* fields (and partial_rotary_factor). transformers 5 writes
    ``rope_parameters``; older configs ``rope_scaling`` (None for plain RoPE) next to
    ``rope_theta``. When both are there, transformers 5 takes ``rope_scaling``, and so do we.
    Phi-3 alone rotates part of each head and alone reads LongRoPE (its old names ``su`` and
    ``yarn`` mean it there, as transformers' Phi3Config reads them)."""
    key = rope_key(raw)
    rope = raw.get(key) or {}
    if not isinstance(rope, dict) or any(isinstance(v, dict) for v in rope.values()):
        raise ModelConfigError(f"{where}: {key}={rope!r} {ENGINE} (one dict for all layers)")
    type_key = "rope_type" if "rope_type" in rope else "type"
    kind = rope.get(type_key, "default")
    kind_of = str(raw.get("model_type"))
    phi3 = kind_of == "phi3"
    if phi3 and kind in ("su", "yarn"):
        kind = "longrope"
    own = {"longrope": "phi3", "proportional": "gemma4_text"}  # (each only on its family)
    if kind not in ROPE_TYPES or own.get(kind, kind_of) != kind_of:
        raise ModelConfigError(
            f"{where}: {key}.{type_key}={kind!r} {ENGINE} "
            f"({', '.join(t for t in ROPE_TYPES if t not in own)}; longrope on phi3, "
            "proportional on gemma4_text)")
    partial = rope.get("partial_rotary_factor", raw.get("partial_rotary_factor",
                                                        _DEFAULT_PARTIAL.get(kind_of, 1.0)))
    if partial != 1.0 and raw.get("model_type") not in PARTIAL_ROTARY_FAMILIES:
        raise ModelConfigError(
            f"{where}: {key}.partial_rotary_factor={partial!r} {ENGINE} (1.0)")
    theta_key = f"{key}.rope_theta" if "rope_theta" in rope else "rope_theta"
    # (transformers' default_theta where the config names none)
    theta = rope.get("rope_theta", raw.get("rope_theta", DEFAULT_THETA.get(
        raw.get("model_type", ""), 10000.0)))
    out: dict[str, Any] = {"rope_type": kind, "rope_theta": number(theta, theta_key, where)}
    needs = {"linear": ("factor",), "yarn": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor")}.get(kind, ())  # fmt: skip
    for name in needs:
        if name not in rope:
            raise ModelConfigError(f"{where}: {key}.{name} is missing (rope_type {kind!r})")
        out[f"rope_{name}"] = number(rope[name], f"{key}.{name}", where)
    if kind in ("llama3", "yarn"):
        # transformers' default for a missing original length is max_position_embeddings.
        original = rope.get("original_max_position_embeddings",
                            raw.get("original_max_position_embeddings", 0))  # fmt: skip
        out["rope_original_max_position_embeddings"] = int(
            number(original, f"{key}.original_max_position_embeddings", where)
        )
    if kind == "yarn":
        out.update(_yarn_fields(rope, key, where))
    if kind == "proportional":  # (Gemma 4's; its factor divides every frequency)
        out["rope_factor"] = number(rope.get("factor", 1.0), f"{key}.factor", where)
    if kind == "longrope":
        out.update(_longrope_fields(raw, rope, key, where))
    if partial != 1.0:
        out["partial_rotary_factor"] = number(partial, "partial_rotary_factor", where)
    return out


def _longrope_fields(raw: dict[str, Any], rope: dict[str, Any], key: str,
                     where: str) -> dict[str, Any]:
    """LongRoPE's factors, original context (Phi3Config's default 4096), ``factor`` (else
    max_position_embeddings / original, as transformers derives it) and attention factor."""
    out: dict[str, Any] = {}
    for name in ("short_factor", "long_factor"):
        factors = rope.get(name)
        if not isinstance(factors, list) or not factors or not all(
                isinstance(f, int | float) and not isinstance(f, bool) and f > 0
                for f in factors):
            raise ModelConfigError(f"{where}: {key}.{name} is not a list of positive numbers")
        out[f"rope_{name}"] = tuple(float(f) for f in factors)
    original = rope.get("original_max_position_embeddings",
                        raw.get("original_max_position_embeddings", 4096))
    if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
        raise ModelConfigError(f"{where}: original_max_position_embeddings={original!r} is not "
                               "a positive integer")
    out["rope_original_max_position_embeddings"] = original
    factor = rope.get("factor")
    out["rope_factor"] = (number(factor, f"{key}.factor", where) if factor is not None
                          else raw["max_position_embeddings"] / original)
    if rope.get("attention_factor") is not None:
        out["rope_attention_factor"] = number(rope["attention_factor"],
                                               f"{key}.attention_factor", where)
    return out


def _yarn_fields(rope: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """YaRN's optional keys; null or absent takes transformers' default (beta_fast 32, beta_slow
    1, attention_factor derived from factor/mscale/mscale_all_dim, truncate true)."""
    out: dict[str, Any] = {}
    for name in ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim"):
        if rope.get(name) is not None:
            out[f"rope_{name}"] = number(rope[name], f"{key}.{name}", where)
    truncate = rope.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ModelConfigError(f"{where}: {key}.truncate={truncate!r} is not true or false")
    out["rope_truncate"] = truncate
    return out


def rope_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """``cfg``'s rope as transformers 5's ``rope_parameters`` says it (``config_to_hf``'s)."""
    rope: dict[str, Any] = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta}
    if cfg.rope_type != "default" and (cfg.rope_type != "proportional" or cfg.rope_factor != 1):
        rope["factor"] = cfg.rope_factor
    if cfg.rope_type in ("llama3", "yarn"):
        rope["original_max_position_embeddings"] = (
            cfg.rope_original_max_position_embeddings or cfg.max_position_embeddings)
    if cfg.rope_type == "llama3":
        rope.update(low_freq_factor=cfg.rope_low_freq_factor,
                    high_freq_factor=cfg.rope_high_freq_factor)
    if cfg.rope_type == "yarn":
        rope.update(beta_fast=cfg.rope_beta_fast, beta_slow=cfg.rope_beta_slow,
                    truncate=cfg.rope_truncate)
        # absent (not 0) where ModelConfig derives them, so transformers derives them alike
        rope.update({name: value for name in ("attention_factor", "mscale", "mscale_all_dim")
                     if (value := getattr(cfg, f"rope_{name}"))})
    if cfg.rope_type == "longrope":  # (factor written: transformers would derive it alike)
        rope.update(short_factor=list(cfg.rope_short_factor),
                    long_factor=list(cfg.rope_long_factor),
                    original_max_position_embeddings=cfg.context_limit)
        if cfg.rope_attention_factor:
            rope["attention_factor"] = cfg.rope_attention_factor
    if cfg.partial_rotary_factor != 1.0:
        rope["partial_rotary_factor"] = cfg.partial_rotary_factor
    return rope
