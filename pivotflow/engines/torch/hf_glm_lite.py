"""GLM-4.7-Flash's family (``glm4_moe_lite``: Zhipu's 30B-A3B): DeepSeek-V3's latent attention
(queries through a ``q_lora_rank`` latent, keys and values from one ``kv_lora_rank`` latent
beside a rotary key all heads share, its rotary pairs interleaved) in GLM-4.5's layer: a
sigmoid router choosing with a correction bias, ``n_shared_experts`` shared, weights times
``routed_scaling_factor``. Which layers are sparse its config says per layer
(``mlp_layer_types``: "dense" or "sparse"; the first dense where it says none), where vLLM
reads ``first_k_dense_replace``: pivotflow writes both, and its held configs say the latter
too. Its multi-token-prediction layer (a layer past the last) is left out as the folder is
read, as transformers leaves it.
"""

from __future__ import annotations

from typing import Any

from pivotflow.engines.torch.hf_families import (
    glm4_moe_fields,
    glm4_moe_to_hf,
    latent_fields,
    number,
)
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.errors import ModelConfigError

# Glm4MoeLiteConfig's defaults
_DEFAULTS = {"n_routed_experts": 64, "moe_intermediate_size": 1536, "n_shared_experts": 1,
             "routed_scaling_factor": 1.8, "n_group": 1, "topk_group": 1,
             "num_experts_per_tok": 4, "norm_topk_prob": True, "q_lora_rank": 768,
             "kv_lora_rank": 512, "qk_rope_head_dim": 64, "v_head_dim": 256,
             "qk_nope_head_dim": 192, "rms_norm_eps": 1e-5}


def glm_lite_keys(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with Glm4MoeLiteConfig's defaults where it names none (its ``head_dim`` is
    another name for ``qk_rope_head_dim`` there)."""
    out = {**_DEFAULTS, **raw}
    if raw.get("head_dim") is not None and "qk_rope_head_dim" not in raw:
        out["qk_rope_head_dim"] = raw["head_dim"]
    return out


def dense_layers(raw: dict[str, Any], layers: int, where: str) -> tuple[int, ...]:
    """The dense layers ``mlp_layer_types`` names (GLM-4.7-Flash's, HY V3's), else the first."""
    types = raw.get("mlp_layer_types")
    if types is None:
        return (0,) if layers else ()
    if not isinstance(types, list) or len(types) != layers or any(
            t not in ("dense", "sparse") for t in types):
        raise ModelConfigError(f"{where}: mlp_layer_types={types!r} is not one of 'dense', "
                               f"'sparse' for each of the {layers} layers")
    return tuple(i for i, t in enumerate(types) if t == "dense")


def glm_lite_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """ModelConfig's latent attention and expert fields for a glm4_moe_lite config."""
    merged = glm_lite_keys(raw)
    out = glm4_moe_fields({**merged, "first_k_dense_replace": 0}, layers, where)
    interleave = merged.get("rope_interleave", True)
    if not isinstance(interleave, bool):
        raise ModelConfigError(f"{where}: rope_interleave={interleave!r} is not true or false")
    return {**out, **latent_fields(merged, where), "rope_interleave": interleave,
            "mlp_only_layers": dense_layers(merged, layers, where),
            "routed_scaling_factor": number(merged["routed_scaling_factor"],
                                            "routed_scaling_factor", where)}


def glm_lite_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """Glm4MoeLiteConfig's keys for ``cfg``: GLM-4.5's expert keys (``first_k_dense_replace``
    among them, vLLM's), each layer's kind, the latent attention's. Raises ModelConfigError
    where its dense layers are not the first ones (vLLM can say no other)."""
    out = {k: v for k, v in glm4_moe_to_hf(cfg).items()
           if k not in ("use_qk_norm", "partial_rotary_factor")}
    dense = out["first_k_dense_replace"]
    return {**out, "mlp_layer_types": ["dense" if i < dense else "sparse"
                                       for i in range(cfg.num_hidden_layers)],
            "q_lora_rank": cfg.q_lora_rank or None, "kv_lora_rank": cfg.kv_lora_rank,
            "qk_nope_head_dim": cfg.qk_nope_head_dim, "qk_rope_head_dim": cfg.qk_rope_head_dim,
            "v_head_dim": cfg.v_head_dim, "rope_interleave": cfg.rope_interleave,
            "head_dim": cfg.qk_rope_head_dim}  # (its config's name for the rotary part's width)


def glm_lite_vllm_keys(config: dict[str, Any]) -> dict[str, Any]:
    """A glm4_moe_lite config with ``first_k_dense_replace`` (vLLM's module reads that, not
    ``mlp_layer_types``) saying its leading dense layers."""
    types = config.get("mlp_layer_types")
    if not isinstance(types, list):
        return {"first_k_dense_replace": 1, **config}
    return {**config, "first_k_dense_replace": leading_dense(types)}


def leading_dense(types: list[str]) -> int:
    """How many of ``mlp_layer_types``' layers are dense before the first sparse one (what
    vLLM's ``first_k_dense_replace`` can say)."""
    return next((i for i, t in enumerate(types) if t != "dense"), len(types))
