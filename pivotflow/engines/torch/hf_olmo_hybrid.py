"""OLMo Hybrid's ``config.json`` (``model_type`` olmo_hybrid: allenai/Olmo-Hybrid-7B) <->
ModelConfig's fields.

Its layers are gated DeltaNets (``layer_types`` "linear_attention"; by default three of every
four, the fourth full, the last full if none is) in Llama's pre-norm layer, and OLMo-3's
post-norm attention layers (q and k normalised over their whole projections) between them.
Its delta rule writes at up to twice the rate (``linear_allow_neg_eigval``: beta = 2
sigmoid(b)); its DeltaNet widths default to OlmoHybridConfig's (key heads and value heads as
many as the attention's, key dim 3/4 of hidden over them, value dim twice that). The released
checkpoints turn no position into q and k: a null ``rope_theta``, which transformers reads as
no rope at all, as pivotflow does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pivotflow.errors import ModelConfigError

if TYPE_CHECKING:
    from pivotflow.engines.torch.model_config import ModelConfig

KIND = "olmo_hybrid"
_NOPE = "_olmo_hybrid_nope"  # (set by olmo_hybrid_keys, read by olmo_hybrid_fields)
_LINEAR_KEYS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                "linear_value_head_dim", "linear_conv_kernel_dim")


def olmo_hybrid_keys(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with a null ``rope_theta`` (no rope, the released checkpoints') said as the
    default rope plus a note that no layer turns it, so config_from_hf's rope reading runs."""
    rope = raw.get("rope_parameters") or raw.get("rope_scaling")
    theta = (rope or {}).get("rope_theta", raw.get("rope_theta", 0.0))
    if theta is not None:
        return raw
    plain = {"rope_type": "default", "rope_theta": 10000.0}
    return {**{k: v for k, v in raw.items() if k not in ("rope_scaling", "rope_theta")},
            "rope_parameters": plain, _NOPE: True}


def _positive(raw: dict[str, Any], key: str, default: int, where: str) -> int:
    value = raw.get(key)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelConfigError(f"{where}: {key}={value!r} is not a positive integer")
    return value


def olmo_hybrid_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """OLMo Hybrid's own fields (``raw`` as ``olmo_hybrid_keys`` gave it)."""
    from pivotflow.engines.torch.hf_families import ENGINE

    heads = raw["num_attention_heads"]
    out: dict[str, Any] = {
        "linear_num_key_heads": _positive(raw, "linear_num_key_heads", heads, where),
        "linear_num_value_heads": _positive(raw, "linear_num_value_heads", heads, where),
        "linear_conv_kernel_dim": _positive(raw, "linear_conv_kernel_dim", 4, where)}
    key_dim = int(0.75 * raw["hidden_size"] / out["linear_num_key_heads"])
    out["linear_key_head_dim"] = _positive(raw, "linear_key_head_dim", key_dim, where)
    out["linear_value_head_dim"] = _positive(raw, "linear_value_head_dim",
                                             2 * out["linear_key_head_dim"], where)
    negative = raw.get("linear_allow_neg_eigval", True)
    if not isinstance(negative, bool):
        raise ModelConfigError(f"{where}: linear_allow_neg_eigval={negative!r} is not true or "
                               "false")
    out["linear_allow_neg_eigval"] = negative
    types = raw.get("layer_types")
    if types and any(t not in ("linear_attention", "full_attention") for t in types):
        raise ModelConfigError(f"{where}: layer_types={types!r} {ENGINE} on {KIND} "
                               "(linear_attention, full_attention)")
    if not types:  # (OlmoHybridConfig's: every fourth full, the last if none is)
        types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]
        if "full_attention" not in types:
            types[-1] = "full_attention"
    out["linear_attention_layers"] = tuple(
        i for i, t in enumerate(types) if t == "linear_attention")
    if raw.get(_NOPE):
        out["nope_layers"] = tuple(range(layers))
    return out


def olmo_hybrid_to_hf(cfg: ModelConfig, rope: dict[str, Any]) -> dict[str, Any]:
    """OLMo Hybrid's own keys for ``config_to_hf`` (no token ids, as for phi3); no rope said
    as its null ``rope_theta`` in ``rope`` (config_to_hf's rope dict, changed in place)."""
    nope = set(cfg.nope_layers)
    if nope and nope != set(range(cfg.num_hidden_layers)):
        raise ModelConfigError("an olmo_hybrid checkpoint turns rope on every layer or on none, "
                               f"not on some (nope_layers {sorted(nope)})")
    if nope:
        rope["rope_theta"] = None
    return {"attention_bias": cfg.attention_bias, "pad_token_id": None, "bos_token_id": None,
            "eos_token_id": None, "rope_theta": rope["rope_theta"],
            "linear_allow_neg_eigval": cfg.linear_allow_neg_eigval,
            "layer_types": ["linear_attention" if cfg.is_linear(i) else "full_attention"
                            for i in range(cfg.num_hidden_layers)],
            **{key: getattr(cfg, key) for key in _LINEAR_KEYS}}
