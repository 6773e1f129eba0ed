"""Mistral AI's Ministral 3 (``ministral3``: 3B, 8B, 14B; the text model of their
Mistral3ForConditionalGeneration folders): Mistral's layer with YaRN and, past the original
context, queries scaled by position after rope, ``1 + beta * log(1 + floor(p / L))`` (its rope's
``llama_4_scaling_beta``, L its ``original_max_position_embeddings``: Llama 4's scaling;
``rope.query_scale``). Within L the scale is 1 and the model is Mistral's.

Ministral3Config's defaults where a config names none: heads of 128, epsilon 1e-5, no sliding
window, and its rope: YaRN by 16 from 16384 positions, theta 1e6, mscale 1 and 1, beta 0.1.
vLLM's Mistral module reads the scaling from a key of its own (``llama_4_scaling``), which
``ministral_vllm_keys`` adds to the configs pivotflow holds.
"""

from __future__ import annotations

from typing import Any

from pivotflow.engines.torch.hf_families import number
from pivotflow.engines.torch.hf_rope import rope_key
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.errors import ModelConfigError

_DEFAULT_ROPE = {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0,
                 "original_max_position_embeddings": 16384, "beta_fast": 32.0, "beta_slow": 1.0,
                 "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}


def _rope(raw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    key = rope_key(raw)
    return key, raw.get(key) or {}


def ministral_keys(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with Ministral3Config's defaults where it names none (its rope above all)."""
    out = {**raw, "head_dim": raw.get("head_dim") or 128,
           "rms_norm_eps": raw.get("rms_norm_eps", 1e-5),
           "sliding_window": raw.get("sliding_window")}
    key, rope = _rope(raw)
    if not rope:
        out[key] = dict(_DEFAULT_ROPE)
    return out


def ministral_fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """ModelConfig's ``llama4_scaling_beta`` (Ministral 3's, Mistral 4's). Raises
    ModelConfigError naming ``where`` for a beta without the original context it divides
    positions by (a yarn or llama3 rope's)."""
    key, rope = _rope(raw)
    beta = rope.get("llama_4_scaling_beta")
    if beta is None:
        return {}
    if rope.get("original_max_position_embeddings") is None:
        raise ModelConfigError(f"{where}: {key}.llama_4_scaling_beta needs {key}."
                               "original_max_position_embeddings (the context it scales past)")
    return {"llama4_scaling_beta": number(beta, f"{key}.llama_4_scaling_beta", where)}


def ministral_to_hf(cfg: ModelConfig, rope: dict[str, Any]) -> dict[str, Any]:
    """Ministral3Config's keys for ``cfg``; its scaling beta goes into ``rope`` (the written
    ``rope_parameters``)."""
    query_scaling_to_hf(cfg, rope)
    return {"sliding_window": cfg.sliding_window or None, "pad_token_id": None,
            "bos_token_id": None, "eos_token_id": None}


def query_scaling_to_hf(cfg: ModelConfig, rope: dict[str, Any]) -> None:
    """``cfg``'s Llama 4 query scaling (Ministral 3's, Mistral 4's) into ``rope``, the written
    ``rope_parameters``: its beta and the original context it scales past."""
    if cfg.llama4_scaling_beta:
        rope["llama_4_scaling_beta"] = cfg.llama4_scaling_beta
        rope.setdefault("original_max_position_embeddings",
                        cfg.rope_original_max_position_embeddings or cfg.max_position_embeddings)


def vllm_scaling(rope: dict[str, Any]) -> dict[str, Any]:
    """vLLM's own key for a rope's Llama 4 query scaling (it reads none of transformers'
    rope keys for it), or nothing without a beta and its original context."""
    beta, original = rope.get("llama_4_scaling_beta"), rope.get("original_max_position_embeddings")
    if beta is None or original is None:
        return {}
    return {"llama_4_scaling": {"original_max_position_embeddings": original, "beta": beta}}


def ministral_vllm_keys(config: dict[str, Any]) -> dict[str, Any]:
    """A Ministral 3 config with the key vLLM's Mistral module reads its scaling from (it reads
    none of transformers' rope keys for it: without this, no scaling past the context)."""
    _, rope = _rope(ministral_keys(config))
    if "llama_4_scaling" in config:
        return config
    return {**config, **vllm_scaling(rope)}
