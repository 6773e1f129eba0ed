"""Liquid AI LFM2's ``config.json`` (``model_type`` lfm2: LFM2-350M to 2.6B) <-> ModelConfig's
fields.

Its layers are gated short convolutions (``layer_types`` "conv"; ``short_conv``) or attention
with q and k normalised per head ("full_attention"; by default every layer, or those
``full_attn_idxs`` names), each with a SwiGLU MLP whose width LFM2 derives from
``intermediate_size`` (``block_auto_adjust_ff_dim``: two thirds of it, times
``block_ffn_dim_multiplier``, rounded up to ``block_multiple_of``). Defaults are
Lfm2Config's where a key is absent.

LFM2-MoE (``lfm2_moe``: LFM2-8B-A1B) has those layers, its first ``num_dense_layers`` MLPs dense
(``intermediate_size`` as it is: nothing derived) and the others ``num_experts`` experts, the
top ``num_experts_per_tok`` a token, by a sigmoid router choosing with a correction bias on the
block (``feed_forward.expert_bias``, held on the router), renormalised (1e-6 added to the sum:
``ModelConfig.router_norm_eps``), times ``routed_scaling_factor``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pivotflow.errors import ModelConfigError

if TYPE_CHECKING:
    from pivotflow.engines.torch.model_config import ModelConfig

KIND = "lfm2"
_TYPES = "_lfm2_layer_types"  # (set by lfm2_keys, read by lfm2_fields)


def lfm2_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with the keys config_from_hf reads said LFM2's way: ``rms_norm_eps`` its
    ``norm_eps``, ``intermediate_size`` its MLP's real width, its tying (``tie_embedding``,
    its old name); its layer types kept apart (hf_windows reads none of "conv")."""
    from pivotflow.engines.torch.hf_families import ENGINE

    layers = raw.get("num_hidden_layers")
    types = raw.get("layer_types")
    if types is None and isinstance(layers, int):
        full = raw.get("full_attn_idxs")
        full = range(layers) if full is None else full
        types = ["full_attention" if i in full else "conv" for i in range(layers)]
    if not isinstance(types, list) or any(t not in ("conv", "full_attention") for t in types):
        raise ModelConfigError(f"{where}: layer_types={types!r} {ENGINE} on {KIND} (conv, "
                               "full_attention)")
    out = {k: v for k, v in raw.items() if k != "layer_types"}
    tied = raw.get("tie_embedding", raw.get("tie_word_embeddings", True))
    out = {**out, _TYPES: types, "rms_norm_eps": raw.get("norm_eps", 1e-5),
           "tie_word_embeddings": tied}
    if raw.get("model_type") == "lfm2_moe":  # (Lfm2MoeConfig's width, as it is)
        return {**out, "intermediate_size": raw.get("intermediate_size", 7168)}
    return {**out, "intermediate_size": _mlp_width(raw.get("block_ff_dim",
                                                           raw.get("intermediate_size", 12288)),
                                                   raw, where)}


def _mlp_width(size: Any, raw: dict[str, Any], where: str) -> Any:
    """The MLP's width Lfm2MLP builds from ``size`` (its intermediate_size)."""
    if not raw.get("block_auto_adjust_ff_dim", True) or not isinstance(size, int):
        return size
    size = int(2 * size / 3)
    multiplier = raw.get("block_ffn_dim_multiplier", 1.0)
    if multiplier is not None:
        of = raw.get("block_multiple_of", 256)
        if isinstance(of, bool) or not isinstance(of, int) or of <= 0:
            raise ModelConfigError(f"{where}: block_multiple_of={of!r} is not a positive "
                                   "integer")
        size = int(multiplier * size)
        size = of * ((size + of - 1) // of)
    return size


def lfm2_fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """LFM2's own fields (``raw`` as ``lfm2_keys`` gave it)."""
    taps = raw.get("conv_L_cache", 3)
    if isinstance(taps, bool) or not isinstance(taps, int) or taps < 2:
        raise ModelConfigError(f"{where}: conv_L_cache={taps!r} is not an integer >= 2")
    bias = raw.get("conv_bias", False)
    if not isinstance(bias, bool):
        raise ModelConfigError(f"{where}: conv_bias={bias!r} is not true or false")
    convs = tuple(i for i, t in enumerate(raw[_TYPES]) if t == "conv")
    out = {"linear_attention_layers": convs, "linear_conv_kernel_dim": taps if convs else 0,
           "conv_bias": bias}
    return {**out, **_expert_fields(raw, where)} if raw.get("model_type") == "lfm2_moe" else out


def _expert_fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """LFM2-MoE's experts (Lfm2MoeConfig's defaults). A router without its correction bias
    (``use_expert_bias`` false, which no released model has) is refused."""
    from pivotflow.engines.torch.hf_families import ENGINE, number

    if raw.get("use_expert_bias", True) is not True:
        raise ModelConfigError(f"{where}: use_expert_bias={raw['use_expert_bias']!r} {ENGINE} "
                               "on lfm2_moe (true)")
    out: dict[str, Any] = {}
    for field, key, default in (("num_experts", "num_experts", 32),
                                ("num_experts_per_tok", "num_experts_per_tok", 4),
                                ("moe_intermediate_size", "moe_intermediate_size", 1792),
                                ("dense", "num_dense_layers", 2)):
        value = out[field] = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ModelConfigError(f"{where}: {key}={value!r} is not a non-negative integer")
    norm = raw.get("norm_topk_prob", True)
    if not isinstance(norm, bool):
        raise ModelConfigError(f"{where}: norm_topk_prob={norm!r} is not true or false")
    return {**{k: v for k, v in out.items() if k != "dense"},
            "mlp_only_layers": tuple(range(out["dense"])), "scoring_func": "sigmoid",
            "norm_topk_prob": norm,
            "routed_scaling_factor": number(raw.get("routed_scaling_factor", 1.0),
                                             "routed_scaling_factor", where)}


def lfm2_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """LFM2's (and LFM2-MoE's) own keys for ``config_to_hf``: its MLP's width as it is (no
    adjusting), its layer types, no token ids (as for phi3). Raises ModelConfigError for an
    LFM2-MoE whose dense layers are not the first ones (all its config can say)."""
    out = {"layer_types": ["conv" if cfg.is_linear(i) else "full_attention"
                           for i in range(cfg.num_hidden_layers)],
           "norm_eps": cfg.rms_norm_eps, "conv_L_cache": cfg.linear_conv_kernel_dim or 3,
           "conv_bias": cfg.conv_bias, "conv_dim": cfg.hidden_size,
           "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
    if cfg.architecture == "lfm2_moe":
        dense = len(cfg.mlp_only_layers)
        if cfg.mlp_only_layers != tuple(range(dense)) or cfg.decoder_sparse_step != 1:
            raise ModelConfigError("an lfm2_moe checkpoint has its dense layers first "
                                   "(num_dense_layers) and every later layer sparse")
        return {**out, "num_experts": cfg.num_experts,
                "num_experts_per_tok": cfg.num_experts_per_tok,
                "moe_intermediate_size": cfg.moe_intermediate_size, "num_dense_layers": dense,
                "use_expert_bias": True, "norm_topk_prob": cfg.norm_topk_prob,
                "routed_scaling_factor": cfg.routed_scaling_factor,
                "output_router_logits": False}
    # (the Hub's configs say block_dim too; vLLM reads it)
    return {**out, "block_auto_adjust_ff_dim": False, "block_dim": cfg.hidden_size}
