"""Tencent Hunyuan's dense models (``hunyuan_v1_dense``: Hunyuan-0.5B to 7B): Llama's layer with
q and k normalised per head *after* rope (``ModelConfig.qk_norm_after_rope``; its files name the
norms ``query_layernorm``/``key_layernorm``, held as q_norm/k_norm) and its own rope scaling.
Hunyuan-MoE (``hunyuan_v1_moe``: Hunyuan-A13B) has that attention and, on every layer, a shared
MLP every token goes through (``mlp.shared_mlp``, held as one shared expert) beside routed
experts as wide (``intermediate_size``), chosen by a softmax router's top ``moe_topk``,
renormalised (its ``mlp.gate.wg``, held as ``mlp.gate``).

Its configs say the rope ``{"type": "dynamic", "alpha": A, ...}``: NTK scaling by a fixed alpha,
which transformers reads as a stretched base, ``theta * A ** (d / (d - 2))`` for heads of d, the
same at every length (its ``ntk_alpha``): pivotflow holds that base as plain rope's theta, which
computes the same frequencies. ``dynamic`` without an alpha scales by the sequence's length and
is refused (rope_fields names it), as are cross-layer attention (``use_cla``: layers sharing
another's keys and values) and no rope at all (``use_rotary_pos_emb`` false).
"""

from __future__ import annotations

from typing import Any

from pivotflow.engines.torch.hf_families import ENGINE, number
from pivotflow.engines.torch.hf_rope import rope_key
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.errors import ModelConfigError


def hunyuan_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with HunYuanDenseV1Config's norm epsilon (1e-5), and its alpha rope said as
    plain rope with the base it stretches to. Raises ModelConfigError naming ``where`` and the
    key for what the embedded engine does not run."""
    for key, runs in (("use_cla", False), ("use_rotary_pos_emb", True)):
        if key in raw and bool(raw[key]) != runs:
            raise ModelConfigError(f"{where}: {key}={raw[key]!r} {ENGINE} on "
                                   f"{raw.get('model_type')} ({str(runs).lower()})")
    out = {**raw, "rms_norm_eps": raw.get("rms_norm_eps", 1e-5)}
    key = rope_key(raw)
    rope = raw.get(key)
    if not isinstance(rope, dict) or rope.get("alpha") is None or rope.get(
            "rope_type", rope.get("type")) != "dynamic":
        return out
    heads = raw.get("num_attention_heads") or 1
    dim = raw.get("head_dim") or (raw.get("hidden_size") or 0) // heads
    if not isinstance(dim, int) or dim <= 2:
        raise ModelConfigError(f"{where}: head_dim={dim!r} is too narrow for {key}.alpha")
    alpha = number(rope["alpha"], f"{key}.alpha", where)
    theta = number(rope.get("rope_theta", raw.get("rope_theta", 10000.0)), "rope_theta", where)
    out[key] = {"rope_type": "default", "rope_theta": theta * alpha ** (dim / (dim - 2))}
    return out


def _uniform(raw: dict[str, Any], key: str, default: int, where: str) -> int:
    """``key``'s one value: HunYuanMoEV1Config takes a number or one per layer (the Hub's
    configs list one per layer, all equal); layers that differ are refused."""
    value = raw.get(key, default)
    values = value if isinstance(value, list) else [value]
    if not values or len(set(values)) != 1 or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        raise ModelConfigError(f"{where}: {key}={value!r} {ENGINE} (one positive integer, or "
                               "the same one for every layer)")
    return int(values[0])


def hunyuan_moe_fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """Hunyuan-MoE's experts as ModelConfig's fields: ``num_experts`` of them (64 in A13B's
    config; transformers' default 1), the top ``moe_topk`` a token, each as wide as the shared
    MLP (``intermediate_size``: transformers builds both so, whatever the Hub's per-layer
    ``moe_intermediate_size`` and ``num_shared_expert`` say)."""
    return {"num_experts": _uniform(raw, "num_experts", 1, where),
            "num_experts_per_tok": _uniform(raw, "moe_topk", 1, where),
            "moe_intermediate_size": raw["intermediate_size"], "n_shared_experts": 1,
            "norm_topk_prob": True}


def hunyuan_moe_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """Hunyuan-MoE's config keys for ``cfg`` (none for a dense Hunyuan). Raises
    ModelConfigError for experts HunYuanMoEV1 cannot build (another width than the shared
    MLP's, not one shared expert, dense layers, a router that does not renormalise)."""
    if cfg.architecture != "hunyuan_v1_moe":
        return {}
    if (cfg.moe_intermediate_size != cfg.intermediate_size or cfg.n_shared_experts != 1
            or cfg.mlp_only_layers or cfg.decoder_sparse_step != 1 or not cfg.norm_topk_prob):
        raise ModelConfigError("a hunyuan_v1_moe checkpoint has on every layer one shared MLP "
                               "and renormalised experts as wide as intermediate_size")
    return {"num_experts": cfg.num_experts, "moe_topk": cfg.num_experts_per_tok}
