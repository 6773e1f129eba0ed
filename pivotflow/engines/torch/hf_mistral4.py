"""Mistral AI's Mistral 4 (``mistral4``: Mistral-Small-4-119B): DeepSeek-V3's layer (latent
attention, shared and routed experts, its first ``first_k_dense_replace`` MLPs dense) with a
softmax router (no correction bias; groups ranked by their two best scores, as DeepSeek-V3
ranks them) and Ministral 3's query scaling past the original context (``rope.query_scale``,
on the whole query: its latent part and its rotary part).

Mistral4Config's defaults where a config names none, its rope above all: YaRN by 128 from
8192 positions, theta 1e4, mscale 1 and 1, beta 0.1. Its config's ``head_dim`` is a head's
whole query width (no-rope and rope parts, where DeepSeek-V3's says the rotary part's) and its
rope's ``partial_rotary_factor`` the rotary part's share of it: both follow from the latent
widths, and another value is refused, not read as another model.

vLLM 0.32 has no Mistral 4 module of its own: ``mistral4_vllm_overrides`` tells it the model
is DeepSeek-V3's with this router and Llama 4's scaling, which its DeepseekV3ForCausalLM runs.
"""

from __future__ import annotations

from typing import Any

from pivotflow.engines.torch.hf_families import (
    ENGINE,
    glm4_moe_fields,
    glm4_moe_to_hf,
    latent_fields,
    number,
)
from pivotflow.engines.torch.hf_ministral import (
    ministral_fields,
    query_scaling_to_hf,
    vllm_scaling,
)
from pivotflow.engines.torch.hf_rope import rope_key
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.errors import ModelConfigError

# Mistral4Config's defaults
_DEFAULTS = {"n_routed_experts": 128, "moe_intermediate_size": 2048, "n_shared_experts": 1,
             "routed_scaling_factor": 1.0, "kv_lora_rank": 256, "q_lora_rank": 1024,
             "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 64, "n_group": 1,
             "topk_group": 1, "num_experts_per_tok": 4, "first_k_dense_replace": 0,
             "norm_topk_prob": True, "rms_norm_eps": 1e-6}
_DEFAULT_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0,
                 "original_max_position_embeddings": 8192, "beta_fast": 32.0, "beta_slow": 1.0,
                 "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}


def mistral4_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with Mistral4Config's defaults where it names none, its ``head_dim`` and its
    rope's ``partial_rotary_factor`` checked against the latent widths and dropped (the
    latent widths say them). Raises ModelConfigError naming ``where`` and the key otherwise."""
    given = {k: v for k, v in raw.items() if v is not None or k == "q_lora_rank"}
    out = {**_DEFAULTS, **given}
    widths = [out[k] for k in ("qk_nope_head_dim", "qk_rope_head_dim")]
    if not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in widths):
        raise ModelConfigError(f"{where}: qk_nope_head_dim={widths[0]!r} and qk_rope_head_dim="
                               f"{widths[1]!r} are not positive integers")
    whole = sum(widths)
    if out.get("head_dim") not in (None, whole):
        raise ModelConfigError(f"{where}: head_dim={out['head_dim']!r} is not qk_nope_head_dim "
                               f"+ qk_rope_head_dim = {whole} (mistral4's query width)")
    out.pop("head_dim", None)
    key = rope_key(raw)
    rope = dict(raw.get(key) or _DEFAULT_ROPE)
    partial = rope.pop("partial_rotary_factor", None)
    if partial is not None and abs(number(partial, f"{key}.partial_rotary_factor", where)
                                   - widths[1] / whole) > 1e-9:
        raise ModelConfigError(f"{where}: {key}.partial_rotary_factor={partial!r} {ENGINE} on "
                               f"mistral4 (qk_rope_head_dim / head_dim = {widths[1] / whole})")
    rope.pop("max_position_embeddings", None)  # (its default rope's copy of the config's)
    out[key] = rope
    return out


def mistral4_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """ModelConfig's latent attention, expert and query scaling fields for a mistral4 config
    (after ``mistral4_keys``)."""
    out = glm4_moe_fields(raw, layers, where)
    interleave = raw.get("rope_interleave", True)
    if not isinstance(interleave, bool):
        raise ModelConfigError(f"{where}: rope_interleave={interleave!r} is not true or false")
    return {**out, **latent_fields(raw, where), **ministral_fields(raw, where),
            "rope_interleave": interleave,
            "scoring_func": "softmax", "qk_norm": False,
            "routed_scaling_factor": number(raw["routed_scaling_factor"],
                                            "routed_scaling_factor", where)}


def mistral4_to_hf(cfg: ModelConfig, rope: dict[str, Any]) -> dict[str, Any]:
    """Mistral4Config's keys for ``cfg``; its scaling beta and rotary share go into ``rope``
    (the written ``rope_parameters``)."""
    query_scaling_to_hf(cfg, rope)
    rope["partial_rotary_factor"] = cfg.qk_rope_head_dim / cfg.head_dim
    out = {k: v for k, v in glm4_moe_to_hf(cfg).items()
           if k not in ("use_qk_norm", "partial_rotary_factor", "num_nextn_predict_layers")}
    return {**out, "q_lora_rank": cfg.q_lora_rank or None, "kv_lora_rank": cfg.kv_lora_rank,
            "qk_nope_head_dim": cfg.qk_nope_head_dim, "qk_rope_head_dim": cfg.qk_rope_head_dim,
            "v_head_dim": cfg.v_head_dim, "head_dim": cfg.head_dim,
            "rope_interleave": cfg.rope_interleave}


def mistral4_vllm_overrides(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """What vLLM is told of a mistral4 config (``hf_overrides``): DeepSeek-V3's module, a
    softmax router choosing by plain top k, Llama 4's scaling under vLLM's own key. Raises
    ModelConfigError naming ``where`` for grouped routing, which vLLM ranks by a group's best
    score where transformers ranks by its two best (the same choice with one group)."""
    merged = mistral4_keys(raw, where)
    if merged["n_group"] != 1:
        raise ModelConfigError(f"{where}: n_group={merged['n_group']!r} is not served by vLLM "
                               "on mistral4 (1: vLLM ranks groups otherwise than transformers)")
    given = merged[rope_key(raw)]
    rope = {k: v for k, v in given.items() if k not in ("type", "llama_4_scaling_beta")}
    rope.setdefault("rope_type", given.get("type") or "default")
    # (the rotary share, dropped by mistral4_keys, stays out: vLLM would take it of the
    # rotary part's width again)
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "scoring_func": "softmax", "topk_method": "greedy", "rope_parameters": rope,
            **vllm_scaling(given)}
