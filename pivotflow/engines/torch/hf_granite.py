"""Granite 4.0's ``config.json`` (``model_type`` granitemoehybrid: Granite 4.0-H's Mamba2
hybrids and the dense Granite 4.0) <-> ModelConfig's fields.

Its layers are Mamba2 (``layer_types`` "mamba"; transformers 5 says "linear_attention") or
attention ("attention", or "full_attention"); attention turns no position into q and k unless
``position_embedding_type`` is "rope" (the H models' "nope" or null). Every layer has a shared
MLP of ``shared_intermediate_size`` and, with ``num_local_experts`` > 0, experts of
``intermediate_size`` beside it (a softmax over the top k logits); Granite's four multipliers
as Granite 3's. Defaults are GraniteMoeHybridConfig's where a key is absent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pivotflow.engines.torch.hf_mamba import NO_LIMIT, mamba_fields
from pivotflow.errors import ModelConfigError

if TYPE_CHECKING:
    from pivotflow.engines.torch.model_config import ModelConfig

KIND = "granitemoehybrid"
# its legacy layer names (the Hub's configs) -> transformers 5's
_LAYER_NAMES = {"mamba": "linear_attention", "attention": "full_attention"}
# ModelConfig's Mamba2 fields: (Granite's key, GraniteMoeHybridConfig's default)
GRANITE_MAMBA_KEYS: dict[str, tuple[str, Any]] = {
    "mamba_n_heads": ("mamba_n_heads", 128), "mamba_n_groups": ("mamba_n_groups", 1),
    "mamba_d_state": ("mamba_d_state", 256), "mamba_d_conv": ("mamba_d_conv", 4),
    "mamba_expand": ("mamba_expand", 2), "mamba_d_head": ("mamba_d_head", "auto"),
    "mamba_conv_bias": ("mamba_conv_bias", True), "mamba_proj_bias": ("mamba_proj_bias", False)}
_NO_ROPE = (None, "nope")


def granite_layer_types(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """``raw`` with its ``layer_types`` (or ``layers_block_type``, its old name) in
    transformers 5's names, every layer "linear_attention" where it names none (as
    GraniteMoeHybridConfig), and its dense MLP's width as ``intermediate_size`` when it has no
    experts (config_from_hf reads that key)."""
    from pivotflow.engines.torch.hf_families import ENGINE

    types = raw.get("layer_types") or raw.get("layers_block_type")
    if types is None:
        types = ["linear_attention"] * layers
    if not isinstance(types, list) or any(
            not isinstance(t, str) or _LAYER_NAMES.get(t, t) not in _LAYER_NAMES.values()
            for t in types):
        raise ModelConfigError(f"{where}: layer_types={types!r} {ENGINE} on {KIND} (mamba, "
                               "attention)")
    out = {**raw, "layer_types": [_LAYER_NAMES.get(t, t) for t in types]}
    if not _int(raw, "num_local_experts", 8, where):
        out["intermediate_size"] = raw.get("shared_intermediate_size", 1024)
    return out


def _int(raw: dict[str, Any], key: str, default: int, where: str, least: int = 0) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ModelConfigError(f"{where}: {key}={value!r} is not an integer >= {least}")
    return value


def granite_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """Granite 4.0's own fields (``raw`` as ``granite_layer_types`` gave it)."""
    from pivotflow.engines.torch.hf_families import ENGINE, GRANITE_KEYS, number

    out: dict[str, Any] = {
        "linear_attention_layers": tuple(i for i, t in enumerate(raw["layer_types"])
                                         if t == "linear_attention")}
    for key in GRANITE_KEYS:
        out[key] = number(raw.get(key, 1.0), key, where)
        if not out[key] > 0:
            raise ModelConfigError(f"{where}: {key}={raw[key]!r} is not positive")
    position = raw.get("position_embedding_type")
    if position not in (*_NO_ROPE, "rope"):
        raise ModelConfigError(f"{where}: position_embedding_type={position!r} {ENGINE} "
                               "(rope, nope, null)")
    if position in _NO_ROPE:
        out["nope_layers"] = tuple(range(layers))
    if out["linear_attention_layers"]:
        out.update(mamba_fields(raw, GRANITE_MAMBA_KEYS, where))
    experts = _int(raw, "num_local_experts", 8, where)
    if experts:
        out.update(num_experts=experts, norm_topk_prob=True,
                   num_experts_per_tok=_int(raw, "num_experts_per_tok", 2, where, 1),
                   moe_intermediate_size=raw["intermediate_size"],
                   shared_intermediate_size=_int(raw, "shared_intermediate_size", 1024, where))
    return out


def granite_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """Granite 4.0's own keys for ``config_to_hf`` (the layer names the Hub's configs use,
    which vLLM and transformers both read; no token ids, as for phi3)."""
    from pivotflow.engines.torch.hf_families import GRANITE_KEYS

    nope = set(cfg.nope_layers)
    if nope and nope != set(range(cfg.num_hidden_layers)):
        raise ModelConfigError("a granitemoehybrid checkpoint turns rope on every layer or on "
                               f"none, not on some (nope_layers {sorted(nope)})")
    out: dict[str, Any] = {
        "attention_bias": cfg.attention_bias, "pad_token_id": None, "bos_token_id": None,
        "eos_token_id": None, "position_embedding_type": "nope" if nope else "rope",
        "layer_types": ["mamba" if cfg.is_linear(i) else "attention"
                        for i in range(cfg.num_hidden_layers)],
        "attention_multiplier": cfg.attention_scale, "output_router_logits": False,
        **{key: getattr(cfg, key) for key in GRANITE_KEYS if key != "attention_multiplier"}}
    if cfg.num_experts:
        if not cfg.norm_topk_prob or cfg.scoring_func != "softmax" or cfg.mlp_only_layers:
            raise ModelConfigError("a granitemoehybrid checkpoint routes every layer by a "
                                   "softmax over its top k logits")
        out.update(num_local_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
                   intermediate_size=cfg.moe_intermediate_size,
                   shared_intermediate_size=cfg.shared_intermediate_size)
    else:
        out.update(num_local_experts=0, shared_intermediate_size=cfg.intermediate_size)
    if cfg.linear_attention_layers:
        out.update({key: getattr(cfg, key) for key in GRANITE_MAMBA_KEYS},
                   mamba_chunk_size=256)
        if cfg.time_step_limit != NO_LIMIT:  # (absent is none: no inf in the JSON)
            out["time_step_limit"] = list(cfg.time_step_limit)
    return out
