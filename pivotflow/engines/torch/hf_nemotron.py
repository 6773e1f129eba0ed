"""NVIDIA Nemotron-H's ``config.json`` (``model_type`` nemotron_h: Nemotron-H 4B/8B/47B,
Nemotron Nano 2) <-> ModelConfig's fields.

Each of its layers is one block: Mamba2 ("M" in the Hub's ``hybrid_override_pattern``;
transformers 5 writes ``layers_block_type`` "linear_attention"), attention without rope ("*",
"full_attention"), an ungated MLP, relu(x)^2 ("-", "mlp"), or (Nemotron 3's) a mixture of
such experts ("E", "moe") beside a shared one, chosen by DeepSeek-V3's grouped sigmoid router
with a correction bias. Multi-token-prediction layers and Nemotron 3 Super's latent experts
(``moe_latent_size``) are refused in one line. Defaults are
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
        "mlp_blocks": tuple(i for i, b in enumerate(pattern) if b in "-E"),
        "nope_layers": tuple(range(len(pattern))), "hidden_act": "relu2"}
    if out["linear_attention_layers"]:
        out.update(mamba_fields(raw, NEMOTRON_MAMBA_KEYS, where))
    if "E" in pattern:
        out.update(_expert_fields(raw, where),
                   mlp_only_layers=tuple(i for i, b in enumerate(pattern) if b == "-"))
    return out


def _expert_fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """Its MoE blocks' experts and router (NemotronHConfig's defaults where absent)."""
    from pivotflow.engines.torch.hf_families import number

    out: dict[str, Any] = {"scoring_func": "sigmoid"}
    for field, (key, default) in _EXPERT_KEYS.items():
        value = out[field] = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelConfigError(f"{where}: {key}={value!r} is not an integer >= 1")
    norm = raw.get("norm_topk_prob", True)
    if not isinstance(norm, bool):
        raise ModelConfigError(f"{where}: norm_topk_prob={norm!r} is not true or false")
    scale = number(raw.get("routed_scaling_factor", 1.0), "routed_scaling_factor", where)
    return {**out, "norm_topk_prob": norm, "routed_scaling_factor": scale}


# ModelConfig's expert fields: (Nemotron-H's key, NemotronHConfig's default)
_EXPERT_KEYS: dict[str, tuple[str, int]] = {
    "num_experts": ("n_routed_experts", 8), "num_experts_per_tok": ("num_experts_per_tok", 2),
    "moe_intermediate_size": ("moe_intermediate_size", 7688),
    "shared_intermediate_size": ("moe_shared_expert_intermediate_size", 7688),
    "n_group": ("n_group", 1), "topk_group": ("topk_group", 1)}


def nemotron_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """Nemotron-H's own keys for ``config_to_hf``: its blocks as the Hub's pattern (which
    transformers and vLLM both read), its Mamba2 keys, no token ids (as for phi3)."""
    pattern = "".join("M" if cfg.is_linear(i) else "E" if cfg.is_sparse(i)
                      else "-" if i in cfg.mlp_blocks else "*"
                      for i in range(cfg.num_hidden_layers))
    out: dict[str, Any] = {
        "hybrid_override_pattern": pattern, "attention_bias": False, "mlp_bias": False,
        "mlp_hidden_act": "relu2", "layer_norm_epsilon": cfg.rms_norm_eps,
        "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,
        "num_nextn_predict_layers": 0, "residual_in_fp32": False}
    if cfg.num_experts:
        out.update({key: getattr(cfg, field) for field, (key, _) in _EXPERT_KEYS.items()},
                   norm_topk_prob=cfg.norm_topk_prob, n_shared_experts=1,
                   routed_scaling_factor=cfg.routed_scaling_factor, moe_latent_size=None)
    if cfg.linear_attention_layers:
        out.update({key: getattr(cfg, field) for field, (key, _) in NEMOTRON_MAMBA_KEYS.items()},
                   mamba_hidden_act="silu", chunk_size=128)
        if cfg.time_step_limit != NO_LIMIT:  # (absent is none: no inf in the JSON)
            out["time_step_limit"] = list(cfg.time_step_limit)
    return out
