"""Upstage's Solar Open (``solar_open``: Solar-Open-100B): Llama's attention (q/k/v biased
where ``attention_bias`` says, o_proj never; no q/k norm; whole heads rotating unless its rope
names a share) in GLM-4.5's sparse layer on every layer: a sigmoid router choosing with a
correction bias among the ``topk_group`` best of ``n_group`` groups, ``n_shared_experts``
shared, weights renormalised where ``norm_topk_prob`` and times ``routed_scaling_factor``.
SolarOpenConfig's defaults where a config names none: heads of 128, epsilon 1e-5, theta 1e6
(``hf_rope.DEFAULT_THETA``), 128 experts of 1280 (8 a token), one shared.
"""

from __future__ import annotations

from typing import Any

from pivotflow.engines.torch.hf_families import glm4_moe_fields, glm4_moe_to_hf
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.errors import ModelConfigError

# SolarOpenConfig's defaults
_DEFAULTS = {"head_dim": 128, "rms_norm_eps": 1e-5, "n_routed_experts": 128,
             "moe_intermediate_size": 1280, "num_experts_per_tok": 8, "n_shared_experts": 1,
             "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1, "norm_topk_prob": True}


def solar_open_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with SolarOpenConfig's defaults where it names none (a null head_dim derived,
    as transformers' attention derives it)."""
    return {**_DEFAULTS, **raw}


def solar_open_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """ModelConfig's expert fields for a solar_open config: every layer sparse."""
    for key in ("first_k_dense_replace", "use_qk_norm"):  # (keys its class does not have)
        if raw.get(key):
            raise ModelConfigError(f"{where}: {key}={raw[key]!r} is not a solar_open key (its "
                                   "layers are all sparse, its q and k unnormalised)")
    return glm4_moe_fields({**raw, "first_k_dense_replace": 0, "use_qk_norm": False}, layers,
                           where)


def solar_open_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """SolarOpenConfig's keys for ``cfg``. Raises ModelConfigError for a dense layer, which
    it cannot say."""
    if cfg.mlp_only_layers:
        raise ModelConfigError("a solar_open checkpoint has every layer sparse")
    drop = ("use_qk_norm", "partial_rotary_factor", "num_nextn_predict_layers",
            "first_k_dense_replace")
    return {k: v for k, v in glm4_moe_to_hf(cfg).items() if k not in drop}
