"""NVIDIA Nemotron-H's ``config.json`` (``model_type`` nemotron_h: Nemotron-H 4B/8B/47B,
Nemotron Nano 2) <-> ModelConfig's fields.

Each of its layers is one block: Mamba2 ("M" in the Hub's ``hybrid_override_pattern``;
transformers 5 writes ``layers_block_type`` "linear_attention"), attention without rope ("*",
"full_attention") or an ungated MLP, relu(x)^2 ("-", "mlp"). Its mixture-of-experts blocks
("E", Nemotron 3's) and multi-token-prediction layers are refused in one line. Defaults are
NemotronHConfig's where a key is absent; ``residual_in_fp32`` (the residual stream kept in
float32 under bf16) is not followed: pivotflow adds residuals in the model's dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pivotflow.engines.torch.hf_mamba import NO_LIMIT, mamba_fields
from pivotflow.errors import ModelConfigError

if TYPE_CHECKING:
    from pivotflow.engines.torch.model_config import ModelConfig

KIND = "nemotron_h"
# a block's letter in hybrid_override_pattern, by each name a config may give it
_LETTERS = {"M": "M", "*": "*", "-": "-", "E": "E", "mamba": "M", "linear_attention": "M",
            "attention": "*", "full_attention": "*", "mlp": "-", "moe": "E"}
# ModelConfig's Mamba2 fields: (Nemotron-H's key, NemotronHConfig's default)
NEMOTRON_MAMBA_KEYS: dict[str, tuple[str, Any]] = {
    "mamba_n_heads": ("mamba_num_heads", 128), "mamba_d_head": ("mamba_head_dim", 64),
    "mamba_n_groups": ("n_groups", 8), "mamba_d_state": ("ssm_state_size", 128),
    "mamba_d_conv": ("conv_kernel", 4), "mamba_expand": ("expand", 2),
    "mamba_conv_bias": ("use_conv_bias", True), "mamba_proj_bias": ("use_bias", False)}


def nemotron_blocks(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with its blocks as a ``hybrid_override_pattern`` string (from that key, or
    ``layers_block_type``/``layer_types``, either's names) and the keys config_from_hf reads
    said its way: ``num_hidden_layers`` (the blocks'), ``rms_norm_eps``
    (``layer_norm_epsilon``), ``head_dim`` (128 by default, not hidden / heads); its
    ``layer_types`` taken out (hf_windows reads no windows from them)."""
    from pivotflow.engines.torch.hf_families import ENGINE

    given = raw.get("layers_block_type") or raw.get("layer_types")
    if given is None:
        given = raw.get("hybrid_override_pattern", "M-*E")  # (NemotronHConfig's default)
    blocks = list(given) if isinstance(given, str) else given
    if not isinstance(blocks, list) or not blocks or any(
            not isinstance(b, str) or b not in _LETTERS for b in blocks):
        raise ModelConfigError(f"{where}: layer types {given!r} are not Nemotron-H's blocks "
                               "(M, *, -, E; or mamba, attention, mlp, moe)")
    pattern = "".join(_LETTERS[b] for b in blocks)
    if "E" in pattern:
        raise ModelConfigError(f"{where}: mixture-of-experts blocks (E in {pattern!r}) {ENGINE} "
                               f"on {KIND} (M, *, -)")
    for key, runs in (("num_nextn_predict_layers", 0), ("moe_latent_size", None),
                      ("mamba_hidden_act", "silu"), ("mlp_hidden_act", "relu2"),
                      # (transformers' NemotronH never ties its head, whatever this says)
                      ("attention_bias", False), ("tie_word_embeddings", False)):
        if raw.get(key, runs) not in (runs, None if runs == 0 else runs):
            raise ModelConfigError(f"{where}: {key}={raw[key]!r} {ENGINE} on {KIND} ({runs})")
    out = {k: v for k, v in raw.items() if k not in ("layer_types", "layers_block_type")}
    return {**out, "hybrid_override_pattern": pattern, "num_hidden_layers": len(pattern),
            "rms_norm_eps": raw.get("layer_norm_epsilon", 1e-5),
            "head_dim": raw.get("head_dim", 128),
            "num_key_value_heads": raw.get("num_key_value_heads", 8)}


def nemotron_fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """Nemotron-H's own fields (``raw`` as ``nemotron_blocks`` gave it)."""
    pattern = raw["hybrid_override_pattern"]
    out: dict[str, Any] = {
        "linear_attention_layers": tuple(i for i, b in enumerate(pattern) if b == "M"),
        "mlp_blocks": tuple(i for i, b in enumerate(pattern) if b == "-"),
        "nope_layers": tuple(range(len(pattern))), "hidden_act": "relu2"}
    if out["linear_attention_layers"]:
        out.update(mamba_fields(raw, NEMOTRON_MAMBA_KEYS, where))
    return out


def nemotron_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """Nemotron-H's own keys for ``config_to_hf``: its blocks as the Hub's pattern (which
    transformers and vLLM both read), its Mamba2 keys, no token ids (as for phi3)."""
    pattern = "".join("M" if cfg.is_linear(i) else "-" if i in cfg.mlp_blocks else "*"
                      for i in range(cfg.num_hidden_layers))
    out: dict[str, Any] = {
        "hybrid_override_pattern": pattern, "attention_bias": False, "mlp_bias": False,
        "mlp_hidden_act": "relu2", "layer_norm_epsilon": cfg.rms_norm_eps,
        "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,
        "num_nextn_predict_layers": 0, "residual_in_fp32": False}
    if cfg.linear_attention_layers:
        out.update({key: getattr(cfg, field) for field, (key, _) in NEMOTRON_MAMBA_KEYS.items()},
                   mamba_hidden_act="silu", chunk_size=128)
        if cfg.time_step_limit != NO_LIMIT:  # (absent is none: no inf in the JSON)
            out["time_step_limit"] = list(cfg.time_step_limit)
    return out
