"""Liquid AI LFM2's ``config.json`` (``model_type`` lfm2: LFM2-350M to 2.6B) <-> ModelConfig's
fields.

Its layers are gated short convolutions (``layer_types`` "conv"; ``short_conv``) or attention
with q and k normalised per head ("full_attention"; by default every layer, or those
``full_attn_idxs`` names), each with a SwiGLU MLP whose width LFM2 derives from
``intermediate_size`` (``block_auto_adjust_ff_dim``: two thirds of it, times
``block_ffn_dim_multiplier``, rounded up to ``block_multiple_of``). Defaults are
Lfm2Config's where a key is absent.
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
    return {**out, _TYPES: types, "rms_norm_eps": raw.get("norm_eps", 1e-5),
            "tie_word_embeddings": tied,
            "intermediate_size": _mlp_width(raw.get("block_ff_dim",
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
    return {"linear_attention_layers": convs, "linear_conv_kernel_dim": taps if convs else 0,
            "conv_bias": bias}


def lfm2_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """LFM2's own keys for ``config_to_hf``: its MLP's width as it is (no adjusting), its
    layer types, no token ids (as for phi3)."""
    return {"layer_types": ["conv" if cfg.is_linear(i) else "full_attention"
                            for i in range(cfg.num_hidden_layers)],
            "norm_eps": cfg.rms_norm_eps, "block_auto_adjust_ff_dim": False,
            "conv_L_cache": cfg.linear_conv_kernel_dim or 3, "conv_bias": cfg.conv_bias,
            # (the Hub's configs say these; vLLM reads them)
            "conv_dim": cfg.hidden_size, "block_dim": cfg.hidden_size,
            "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
