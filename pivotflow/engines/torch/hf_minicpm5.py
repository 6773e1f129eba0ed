"""OpenBMB's MiniCPM5-MoE (``minicpm5_moe``: MiniCPM5-15B-A2.5B): Llama's attention with its
output gated by a sigmoid (``self_attn.q_gate_proj``: each head's query rows, then its gate's,
Qwen3.5's layout, held as ``q_proj``), in DeepSeek-V3's layer: dense MLPs where
``mlp_layer_types`` says (else the first ``first_k_dense_replace``, one by default), the others
experts chosen by a float32 sigmoid router with a correction bias among the ``topk_group`` best
of ``n_group`` groups, renormalised, times ``routed_scaling_factor``, beside
``n_shared_experts`` shared.

MiniCPM5MoeConfig's defaults where a config names none: heads of 128, theta 5e6
(``hf_rope.DEFAULT_THETA``), 160 experts of 512 (16 a token, one shared), weights times 3.66.
Its ``use_gated_attention`` false is refused, as transformers refuses it.
"""

from __future__ import annotations

from typing import Any

from pivotflow.engines.torch.hf_families import ENGINE, glm4_moe_fields, number
from pivotflow.engines.torch.hf_glm_lite import dense_layers
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.errors import ModelConfigError

# MiniCPM5MoeConfig's defaults
_DEFAULTS = {"head_dim": 128, "n_routed_experts": 160, "num_experts_per_tok": 16,
             "moe_intermediate_size": 512, "n_shared_experts": 1,
             "routed_scaling_factor": 3.66, "n_group": 1, "topk_group": 1,
             "norm_topk_prob": True}


def minicpm5_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with MiniCPM5MoeConfig's defaults where it names none; raises ModelConfigError
    naming ``where`` for attention without its gate."""
    if raw.get("use_gated_attention", True) is False:
        raise ModelConfigError(f"{where}: use_gated_attention=False {ENGINE} on minicpm5_moe "
                               "(true)")
    out = {**_DEFAULTS, **raw}
    if raw.get("mlp_layer_types") is None:  # (its old name for the leading dense layers)
        layers = raw.get("num_hidden_layers") or 0
        dense = raw.get("first_k_dense_replace", 1)
        if isinstance(dense, int) and isinstance(layers, int):
            out["mlp_layer_types"] = ["dense" if i < dense else "sparse" for i in range(layers)]
    return out


def minicpm5_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """ModelConfig's expert fields for a minicpm5_moe config (after ``minicpm5_keys``)."""
    out = glm4_moe_fields({**raw, "first_k_dense_replace": 0, "use_qk_norm": False}, layers,
                          where)
    return {**out, "mlp_only_layers": dense_layers(raw, layers, where),
            "routed_scaling_factor": number(raw["routed_scaling_factor"],
                                            "routed_scaling_factor", where)}


def minicpm5_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """MiniCPM5MoeConfig's keys for ``cfg``: its experts (DeepSeek-V3's names), each layer's
    kind (dense wherever it is)."""
    dense = set(cfg.mlp_only_layers)
    return {"attention_bias": cfg.attention_bias, "n_routed_experts": cfg.num_experts,
            "num_experts_per_tok": cfg.num_experts_per_tok,
            "moe_intermediate_size": cfg.moe_intermediate_size,
            "n_shared_experts": cfg.n_shared_experts, "n_group": cfg.n_group,
            "topk_group": cfg.topk_group, "routed_scaling_factor": cfg.routed_scaling_factor,
            "norm_topk_prob": cfg.norm_topk_prob, "output_router_logits": False,
            "mlp_layer_types": ["dense" if i in dense else "sparse"
                                for i in range(cfg.num_hidden_layers)],
            "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
