"""MiniMax-M2's ``config.json`` (``model_type`` minimax_m2: MiniMax-M2, M2.1, M2.5) <->
ModelConfig's fields.

Every layer attends (q and k RMS-normalised over their whole projections, as OLMo-2's; the
first ``rotary_dim`` of each head rotating, the rest passing through) and routes to experts of
``intermediate_size`` by a sigmoid of the router's logits plus a correction bias (no groups,
the chosen weights renormalised: DeepSeek-V3's router with one group). The Hub's configs are
written for its remote code (``auto_map``): transformers 5 and vLLM run the architecture
natively, and the keys that code reads are checked to say what they run. Its
multi-token-prediction modules (``num_mtp_modules``) are layers past the decoder's last, left
out as the folder is read (``hf_layout``). Defaults are MiniMaxM2Config's where a key is
absent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pivotflow.errors import ModelConfigError

if TYPE_CHECKING:
    from pivotflow.engines.torch.model_config import ModelConfig

KIND = "minimax_m2"
# the remote code's keys, and the value each must have for the math transformers runs
_RUNS: tuple[tuple[str, Any], ...] = (
    ("scoring_func", "sigmoid"), ("use_routing_bias", True), ("use_qk_norm", True),
    ("qk_norm_type", "per_layer"), ("shared_intermediate_size", 0), ("router_jitter_noise", 0))


def minimax_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with MiniMaxM2Config's head_dim (128, not hidden / heads) and its legacy
    ``rotary_dim`` said as ``partial_rotary_factor``, as config_from_hf reads them; raises for
    a remote-code key that asks for other math."""
    from pivotflow.engines.torch.hf_families import ENGINE

    for key, runs in _RUNS:
        if raw.get(key, runs) != runs:
            raise ModelConfigError(f"{where}: {key}={raw[key]!r} {ENGINE} on {KIND} ({runs!r})")
    kinds = raw.get("attn_type_list")
    if kinds is not None and (not isinstance(kinds, list) or any(k != 1 for k in kinds)):
        raise ModelConfigError(f"{where}: attn_type_list={kinds!r} {ENGINE} on {KIND} (every "
                               "layer 1: full attention)")
    out = {**raw, "head_dim": raw.get("head_dim", 128)}
    rotary = raw.get("rotary_dim")
    rope = out.get("rope_parameters") or out.get("rope_scaling") or {}
    if rotary is not None and "partial_rotary_factor" not in rope:
        if isinstance(rotary, bool) or not isinstance(rotary, int) or rotary <= 0:
            raise ModelConfigError(f"{where}: rotary_dim={rotary!r} is not a positive integer")
        out["partial_rotary_factor"] = rotary / out["head_dim"]
    return out


def minimax_fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """MiniMax-M2's experts and router as ModelConfig's."""
    out: dict[str, Any] = {}
    for field, key, default in (("num_experts", "num_local_experts", 256),
                                ("num_experts_per_tok", "num_experts_per_tok", 8)):
        value = out[field] = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelConfigError(f"{where}: {key}={value!r} is not a positive integer")
    return {**out, "moe_intermediate_size": raw["intermediate_size"], "scoring_func": "sigmoid",
            "norm_topk_prob": True}


def minimax_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """MiniMax-M2's own keys for ``config_to_hf``, the remote code's included (vLLM reads
    ``rotary_dim``, ``scoring_func`` and ``use_routing_bias``); no token ids (as for phi3)."""
    from pivotflow.engines.torch.hf_families import check_every_layer_sparse

    check_every_layer_sparse(cfg)
    if (cfg.scoring_func, cfg.n_group, cfg.routed_scaling_factor) != ("sigmoid", 1, 1.0) or (
            not cfg.norm_topk_prob or cfg.shared_width):
        raise ModelConfigError("a minimax_m2 checkpoint routes by a sigmoid with a correction "
                               "bias, one group, renormalised, no shared expert")
    return {"num_local_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
            "rotary_dim": cfg.rotary_dim, "partial_rotary_factor": cfg.partial_rotary_factor,
            "scoring_func": "sigmoid", "use_routing_bias": True, "use_qk_norm": True,
            "qk_norm_type": "per_layer", "num_mtp_modules": 0, "use_mtp": False,
            "output_router_logits": False, "router_jitter_noise": 0.0, "pad_token_id": None,
            "bos_token_id": None, "eos_token_id": None}
