"""Baidu ERNIE 4.5 (``ernie4_5``: 0.3B; ``ernie4_5_moe``: 21B-A3B, 300B-A47B): Llama's layer
with each head's rotary pairs interleaved (held turned, as GLM-4's: ``renamed_layout``), heads
of 128 where the config names none, biases nowhere (``use_bias`` true is refused).

ERNIE 4.5 MoE's sparse layers (every ``moe_layer_interval``-th from ``moe_layer_start_index``
to ``moe_layer_end_index``) route each token to its ``moe_k`` best of ``moe_num_experts``
experts by a softmax whose probabilities, plus a correction bias (``moe_statics``, a load
statistic: it chooses, never weighs), pick the experts; the chosen probabilities, renormalised,
weigh them; ``moe_num_shared_experts`` experts' worth of shared MLP every token also goes
through. Its router runs in float32, as transformers' does. Its multi-token-prediction layer
(``num_nextn_predict_layers``, ``mtp*`` tensors) is left out as the folder is read.
"""

from __future__ import annotations

from typing import Any

from pivotflow.engines.torch.hf_families import ENGINE
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.errors import ModelConfigError

# Ernie4_5_MoeConfig's defaults for the experts
_MOE_DEFAULTS = {"moe_num_experts": 64, "moe_k": 6, "moe_intermediate_size": 1536,
                 "moe_num_shared_experts": 2, "moe_layer_start_index": 1,
                 "moe_layer_end_index": -1, "moe_layer_interval": 1}


def ernie_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with Ernie4_5Config's (and Ernie4_5_MoeConfig's) heads of 128 and epsilon;
    raises ModelConfigError naming ``where`` for biases (``use_bias``)."""
    if raw.get("use_bias"):
        raise ModelConfigError(f"{where}: use_bias={raw['use_bias']!r} {ENGINE} on "
                               f"{raw.get('model_type')} (false)")
    return {**raw, "head_dim": raw.get("head_dim") or 128,
            "rms_norm_eps": raw.get("rms_norm_eps", 1e-5)}


def _count(raw: dict[str, Any], key: str, where: str) -> int:
    value = raw.get(key, _MOE_DEFAULTS[key])
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelConfigError(f"{where}: {key}={value!r} is not an integer")
    return value


def ernie_moe_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """ModelConfig's expert fields for an ERNIE 4.5 MoE config (transformers' names, or
    Ernie4_5_MoeConfig's attribute names: ``num_experts``, ``num_experts_per_tok``)."""
    merged = {**raw}
    for ours, theirs in (("moe_num_experts", "num_experts"), ("moe_k", "num_experts_per_tok")):
        if ours not in merged and theirs in merged:
            merged[ours] = merged[theirs]
    start, end = (_count(merged, k, where) for k in ("moe_layer_start_index",
                                                     "moe_layer_end_index"))
    end = layers - 1 if end < 0 else end
    interval = _count(merged, "moe_layer_interval", where)
    if interval < 1:
        raise ModelConfigError(f"{where}: moe_layer_interval={interval!r} is not positive")
    return {"num_experts": _count(merged, "moe_num_experts", where),
            "num_experts_per_tok": _count(merged, "moe_k", where),
            "moe_intermediate_size": _count(merged, "moe_intermediate_size", where),
            "n_shared_experts": _count(merged, "moe_num_shared_experts", where),
            "decoder_sparse_step": interval, "norm_topk_prob": True,
            "mlp_only_layers": tuple(i for i in range(layers) if not start <= i <= end)}


def ernie_moe_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """Ernie4_5_MoeConfig's keys for ``cfg``'s experts (none for the dense ERNIE 4.5). Raises
    ModelConfigError where its sparse layers are not one run every ``decoder_sparse_step``-th
    (all ERNIE 4.5 MoE can say) or its router does not renormalise."""
    if cfg.architecture != "ernie4_5_moe":
        return {"use_bias": False}
    sparse = [i for i in range(cfg.num_hidden_layers) if cfg.is_sparse(i)]
    start, end = (sparse[0], sparse[-1]) if sparse else (cfg.num_hidden_layers, -1)
    step = cfg.decoder_sparse_step
    if sparse != [i for i in range(start, end + 1) if (i + 1) % step == 0] or (
            not cfg.norm_topk_prob):
        raise ModelConfigError("an ernie4_5_moe checkpoint's sparse layers are every "
                               "moe_layer_interval-th of one run, its router renormalising")
    return {"use_bias": False, "moe_num_experts": cfg.num_experts, "moe_k": cfg.num_experts_per_tok,
            "moe_intermediate_size": cfg.moe_intermediate_size,
            "moe_num_shared_experts": cfg.n_shared_experts, "moe_layer_start_index": start,
            "moe_layer_end_index": end, "moe_layer_interval": step,
            "num_nextn_predict_layers": 0, "output_router_logits": False}
