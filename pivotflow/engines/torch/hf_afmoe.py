"""Arcee's AFMoE (``afmoe``: Trinity Nano, Mini and Large): Gemma's sandwich layer (each
sub-layer's input and output normalised) around attention with q and k normalised per head, its
output gated by a sigmoid of its own projection (``self_attn.gate_proj``; held inside q_proj as
Qwen3.5's gate is: ``params/afmoe_layout``), rope on the sliding layers only (the full ones
turn no position), and past the first ``num_dense_layers`` dense MLPs, experts chosen by a
sigmoid router with a correction bias (``mlp.expert_bias``), renormalised, times
``route_scale``, beside ``num_shared_experts`` experts' worth of shared MLP. With
``mup_enabled`` the embeddings are scaled by sqrt(hidden_size).

AfmoeConfig's defaults where a config names none: heads of 128, epsilon 1e-5, 64 experts of
1408 (6 a token, 2 shared), one dense layer, a window of 1024 on three layers of every four
(``global_attn_every_n_layers``). vLLM reads the router from keys of the released configs'
(``score_func``, ``route_norm``, ``n_group``, ``topk_group``), which ``afmoe_vllm_keys`` adds to
the configs pivotflow holds.
"""

from __future__ import annotations

import math
from typing import Any

from pivotflow.engines.torch.hf_families import ENGINE, expert_counts, number
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.errors import ModelConfigError

# AfmoeConfig's defaults
_DEFAULTS = {"head_dim": 128, "rms_norm_eps": 1e-5, "num_experts": 64,
             "num_experts_per_tok": 6, "num_shared_experts": 2, "moe_intermediate_size": 1408,
             "num_dense_layers": 1, "route_scale": 1.0, "global_attn_every_n_layers": 4,
             "sliding_window": 1024, "mup_enabled": False}
# the router the released configs name (their remote code's keys; vLLM reads them)
_ROUTER = {"score_func": "sigmoid", "route_norm": True, "n_group": 1, "topk_group": 1}


def afmoe_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with AfmoeConfig's defaults where it names none. Raises ModelConfigError naming
    ``where`` for a router key of the released configs' that says other math than transformers
    runs."""
    out = {**_DEFAULTS, **raw}
    for key, runs in _ROUTER.items():
        if key in raw and raw[key] != runs:
            raise ModelConfigError(f"{where}: {key}={raw[key]!r} {ENGINE} on afmoe "
                                   f"({runs!r})")
    return out


def afmoe_sliding(raw: dict[str, Any], types: list[str], layers: int) -> list[int]:
    """The layers that slide: ``layer_types``', else all but every
    ``global_attn_every_n_layers``-th."""
    if types:
        return [i for i, t in enumerate(types) if t == "sliding_attention"]
    every = raw.get("global_attn_every_n_layers") or 4
    return [i for i in range(layers) if (i + 1) % every]


def afmoe_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """ModelConfig's fields for an afmoe config (after ``afmoe_keys``; its windows read by
    ``hf_windows``): experts, router, dense layers, NoPE on the full layers, the embeddings'
    scale."""
    out = expert_counts(raw, where)
    dense = raw["num_dense_layers"]
    if isinstance(dense, bool) or not isinstance(dense, int) or not 0 <= dense <= layers:
        raise ModelConfigError(f"{where}: num_dense_layers={dense!r} is not a number of layers "
                               f"in [0, {layers}]")
    if not isinstance(raw["mup_enabled"], bool):
        raise ModelConfigError(f"{where}: mup_enabled={raw['mup_enabled']!r} is not true or "
                               "false")
    sliding = set(afmoe_sliding(raw, raw.get("layer_types") or [], layers))
    hidden = raw["hidden_size"]
    return {**out, "mlp_only_layers": tuple(range(dense)), "scoring_func": "sigmoid",
            "norm_topk_prob": True, "qk_norm": True,
            "routed_scaling_factor": number(raw["route_scale"], "route_scale", where),
            "nope_layers": tuple(i for i in range(layers) if i not in sliding),
            **({"embedding_multiplier": math.sqrt(hidden)} if raw["mup_enabled"] else {})}


def afmoe_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """AfmoeConfig's keys for ``cfg`` (its windows: ``hf_windows.windows_to_hf``). Raises
    ModelConfigError for what it cannot say: dense layers past the first sparse one, NoPE on
    other layers than the full ones, another embedding scale than mup's."""
    dense = len(cfg.mlp_only_layers)
    if cfg.mlp_only_layers != tuple(range(dense)):
        raise ModelConfigError("an afmoe checkpoint has its dense layers first "
                               "(num_dense_layers)")
    full = tuple(i for i in range(cfg.num_hidden_layers) if not cfg.is_sliding(i))
    if cfg.nope_layers != full:
        raise ModelConfigError("an afmoe checkpoint turns positions on its sliding layers "
                               "and on no other")
    mup = cfg.embedding_multiplier == math.sqrt(cfg.hidden_size)
    if cfg.embedding_multiplier != 1.0 and not mup:
        raise ModelConfigError("an afmoe checkpoint scales its embeddings by sqrt(hidden_size) "
                               "(mup_enabled) or not at all")
    return {"attention_bias": cfg.attention_bias, "num_experts": cfg.num_experts,
            "num_experts_per_tok": cfg.num_experts_per_tok,
            "moe_intermediate_size": cfg.moe_intermediate_size,
            "num_shared_experts": cfg.n_shared_experts, "num_dense_layers": dense,
            "route_scale": cfg.routed_scaling_factor, "mup_enabled": mup,
            "output_router_logits": False, **_ROUTER,
            "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}


def afmoe_vllm_keys(config: dict[str, Any]) -> dict[str, Any]:
    """An afmoe config with the router keys vLLM's module reads (the released configs name
    them; transformers' AfmoeConfig writes none)."""
    return {**_ROUTER, **config}
