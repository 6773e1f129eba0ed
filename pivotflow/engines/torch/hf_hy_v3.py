"""Tencent's HY V3 (``hy_v3``): Llama's layer with q and k normalised per head before rope
(Apertus's attention), dense MLPs where ``mlp_layer_types`` says "dense" (the first where it
says nothing), and elsewhere experts chosen by a sigmoid router with a correction bias on the
sparse block (``mlp.expert_bias``), renormalised, times ``router_scaling_factor``, beside
``num_shared_experts`` experts' worth of shared MLP (``mlp.shared_mlp``; its router
``mlp.router.gate``: the file's names, held as the common ones by ``hf_layout``). Its router
runs in float32 (transformers keeps it so), as every sigmoid router's here.

HYV3Config's defaults where a config names none: heads of 128, epsilon 1e-5, theta
11158840 (``hf_rope.DEFAULT_THETA``), 192 experts of 1536 (8 a token, one shared), weights
times 2.826. vLLM's module reads keys of the released configs' (``expert_hidden_dim``,
``route_norm``, ``qk_norm``, ``first_k_dense_replace``), which ``hy_v3_vllm_keys`` adds to the
configs pivotflow holds.
"""

from __future__ import annotations

from typing import Any

from pivotflow.engines.torch.hf_families import expert_counts, number
from pivotflow.engines.torch.hf_glm_lite import dense_layers, leading_dense
from pivotflow.engines.torch.model_config import ModelConfig

# HYV3Config's defaults
_DEFAULTS = {"head_dim": 128, "rms_norm_eps": 1e-5, "num_experts": 192,
             "num_experts_per_tok": 8, "num_shared_experts": 1, "moe_intermediate_size": 1536,
             "router_scaling_factor": 2.826}


def hy_v3_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with HYV3Config's defaults where it names none (a null head_dim derived, as
    transformers' attention derives it)."""
    return {**_DEFAULTS, **raw}


def hy_v3_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """ModelConfig's expert fields for a hy_v3 config (after ``hy_v3_keys``)."""
    out = expert_counts(raw, where)
    return {**out, "mlp_only_layers": dense_layers(raw, layers, where),
            "scoring_func": "sigmoid", "norm_topk_prob": True, "qk_norm": True,
            "routed_scaling_factor": number(raw["router_scaling_factor"],
                                            "router_scaling_factor", where)}


def hy_v3_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """HYV3Config's keys for ``cfg``, and the ones vLLM reads (``hy_v3_vllm_keys``)."""
    dense = set(cfg.mlp_only_layers)
    out = {"attention_bias": cfg.attention_bias, "mlp_bias": False,
           "num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
           "num_shared_experts": cfg.n_shared_experts,
           "moe_intermediate_size": cfg.moe_intermediate_size,
           "router_scaling_factor": cfg.routed_scaling_factor,
           "mlp_layer_types": ["dense" if i in dense else "sparse"
                               for i in range(cfg.num_hidden_layers)],
           "output_router_logits": False, "pad_token_id": None, "bos_token_id": None,
           "eos_token_id": None}
    return hy_v3_vllm_keys(out)


def hy_v3_vllm_keys(config: dict[str, Any]) -> dict[str, Any]:
    """A hy_v3 config with the keys vLLM's module reads (the released configs name them;
    transformers' HYV3Config writes none): its experts' width, the router renormalising, q/k
    norms, and its leading dense layers (vLLM can say no other)."""
    types = config.get("mlp_layer_types")
    leading = leading_dense(types) if isinstance(types, list) else 1
    return {"expert_hidden_dim": config.get("moe_intermediate_size", 1536), "route_norm": True,
            "qk_norm": True, **config, "first_k_dense_replace": leading}
