"""rednote's dots.llm1 (``dots1``: 142B-A14B): Qwen3's attention (q and k normalised per head,
no biases) in DeepSeek-V3's layer: its first ``first_k_dense_replace`` MLPs dense, the others
``n_routed_experts`` experts chosen by a sigmoid router with a correction bias, among the
``topk_group`` best of ``n_group`` groups, weighed by their scores (renormalised where
``norm_topk_prob``) times ``routed_scaling_factor``, beside ``n_shared_experts`` shared. Its
layers slide within ``sliding_window`` as ``layer_types`` say, else from ``max_window_layers``
on where a window is named (Dots1Config's reading).
"""

from __future__ import annotations

from typing import Any

from pivotflow.engines.torch.hf_families import glm4_moe_fields, glm4_moe_to_hf
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.errors import ModelConfigError

# Dots1Config's defaults (its expert counts have none: a config names them)
_DEFAULTS = {"first_k_dense_replace": 0, "norm_topk_prob": False, "n_group": 1,
             "topk_group": 1, "routed_scaling_factor": 1.0, "moe_intermediate_size": 1408}


def dots_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """ModelConfig's expert fields for a dots1 config."""
    for key in ("n_routed_experts", "num_experts_per_tok", "n_shared_experts"):
        if raw.get(key) is None:
            raise ModelConfigError(f"{where}: required key {key!r} is missing (dots1)")
    return glm4_moe_fields({**_DEFAULTS, **raw, "use_qk_norm": True}, layers, where)


def dots_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """Dots1Config's keys for ``cfg``'s experts (DeepSeek-V3's names)."""
    return {k: v for k, v in glm4_moe_to_hf(cfg).items()
            if k not in ("use_qk_norm", "partial_rotary_factor", "num_nextn_predict_layers")}


def dots_sliding(raw: dict[str, Any], types: list[str], layers: int) -> list[int]:
    """The layers that slide: ``layer_types``', else those from ``max_window_layers`` on (62
    by default) where a window is named."""
    if types:
        return [i for i, t in enumerate(types) if t == "sliding_attention"]
    if raw.get("sliding_window", 4096) is None:
        return []
    first = raw.get("max_window_layers", 62)
    return [i for i in range(layers) if i >= first]
