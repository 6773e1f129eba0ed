"""Each family's own ``config.json`` keys as ModelConfig's fields (``family_fields``), and the
few it writes back that need a check of their own: the expert and router keys of Qwen3-MoE,
Qwen2-MoE, Mixtral, OLMoE, gpt-oss, GLM-4.5, DeepSeek-V2 and V3 (their latent attention's too),
Gemma's gate, scale and soft-capping, Granite's multipliers, SmolLM3's NoPE layers.
``hf_config`` reads what all families share.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pivotflow.engines.torch.architectures import GATED_ACTIVATIONS
from pivotflow.engines.torch.hf_windows import exaone4_sliding, nope_layers
from pivotflow.errors import ModelConfigError
from pivotflow.params.held_config import DEEPSEEK_V3_ROUTER

if TYPE_CHECKING:
    from pivotflow.engines.torch.model_config import ModelConfig

ENGINE = "is not supported by the embedded engine"
GRANITE_KEYS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier",
                "logits_scaling")


def family_fields(raw: dict[str, Any], kind: str, layers: int, where: str) -> dict[str, Any]:
    """The ModelConfig fields family ``kind`` (a model_type) reads from keys of its own
    (``layers``: its num_hidden_layers); nothing for a family without any (``_FIELDS``)."""
    reader = _FIELDS.get(kind)
    return {} if reader is None else reader(raw, layers, where)


def expert_counts(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """ModelConfig's expert counts and widths from the keys AFMoE's and HY V3's configs name
    them by (``num_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``,
    ``num_shared_experts``). Raises ModelConfigError naming ``where`` and the key for one that
    is not a non-negative integer (or is missing)."""
    return counts(raw, where, (("num_experts", "num_experts", None),
                               ("num_experts_per_tok", "num_experts_per_tok", None),
                               ("moe_intermediate_size", "moe_intermediate_size", None),
                               ("n_shared_experts", "num_shared_experts", None)))


def counts(raw: dict[str, Any], where: str,
           specs: tuple[tuple[str, str, int | None], ...]) -> dict[str, int]:
    """ModelConfig's ``field`` for each (field, key, default) of ``specs``: ``raw[key]``, or
    the default where it is absent. Raises ModelConfigError naming ``where`` and the key for
    one that is not a non-negative integer."""
    out: dict[str, int] = {}
    for field, key, default in specs:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ModelConfigError(f"{where}: {key}={value!r} is not a non-negative integer")
        out[field] = value
    return out


def number(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ModelConfigError(f"{where}: {key}={value!r} is not a number")
    return float(value)


def _granite_fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """Granite's four multipliers (GraniteConfig's default 1.0 each)."""
    out = {key: number(raw.get(key, 1.0), key, where) for key in GRANITE_KEYS}
    for key, value in out.items():
        if not value > 0:
            raise ModelConfigError(f"{where}: {key}={value!r} is not positive")
    return out


def _gemma_fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """Gemma 2's and 3's gate and attention scale; Gemma 2's soft-capping (Gemma2Config's
    defaults: 50 on attention scores, 30 on logits; null: none); bidirectional attention
    (EmbeddingGemma's) is refused, and soft-capping on Gemma 3, which transformers' Gemma 3
    reads but no Gemma 3 sets."""
    out: dict[str, Any] = {}
    gemma2 = raw.get("model_type") == "gemma2"
    for key, default in (("final_logit_softcapping", 30.0), ("attn_logit_softcapping", 50.0)):
        value = raw.get(key, default if gemma2 else None)
        if value is not None and not gemma2:
            raise ModelConfigError(f"{where}: {key}={raw[key]!r} {ENGINE} on gemma3_text "
                                   "(null)")
        if value is not None:
            out[key] = number(value, key, where)
            if out[key] <= 0:
                raise ModelConfigError(f"{where}: {key}={value!r} is not positive (null: none)")
    if raw.get("use_bidirectional_attention"):
        raise ModelConfigError(f"{where}: use_bidirectional_attention=True {ENGINE} (false)")
    act = raw.get("hidden_activation", "gelu_pytorch_tanh")
    if act not in GATED_ACTIVATIONS:
        raise ModelConfigError(f"{where}: hidden_activation={act!r} {ENGINE} "
                               f"({', '.join(GATED_ACTIVATIONS)})")
    scalar = number(raw.get("query_pre_attn_scalar", 256), "query_pre_attn_scalar", where)
    return {**out, "hidden_act": act, "query_pre_attn_scalar": scalar}


def _expert_fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """A Qwen3-MoE or Qwen2-MoE config's expert fields, with transformers' defaults where a
    key is absent (the Hub's configs name the count ``num_experts``; transformers 5 writes
    ``num_local_experts``); Qwen2-MoE's gated shared expert."""
    count_key = "num_experts" if "num_experts" in raw else "num_local_experts"
    keys = {"num_experts": count_key, "num_experts_per_tok": "num_experts_per_tok",
            "moe_intermediate_size": "moe_intermediate_size",
            "decoder_sparse_step": "decoder_sparse_step"}  # ModelConfig's field: its key
    defaults = {"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                "decoder_sparse_step": 1}  # transformers' (Qwen3MoeConfig's)
    if raw.get("model_type") == "qwen2_moe":  # (Qwen2MoeConfig's)
        keys["shared_expert_intermediate_size"] = "shared_expert_intermediate_size"
        defaults.update(num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408,
                        shared_expert_intermediate_size=5632)
    qwen3_5 = raw.get("model_type") == "qwen3_5_moe_text"
    if qwen3_5:  # (Qwen3_5MoeTextConfig's: every layer sparse, its router renormalising)
        keys["shared_expert_intermediate_size"] = "shared_expert_intermediate_size"
        defaults.update(num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                        shared_expert_intermediate_size=512)
        del keys["decoder_sparse_step"]
    if raw.get("model_type") == "qwen3_next":  # (Qwen3NextConfig's)
        keys["shared_expert_intermediate_size"] = "shared_expert_intermediate_size"
        defaults.update(num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
                        shared_expert_intermediate_size=512)
    out: dict[str, Any] = {}
    for field, key in keys.items():
        value = out[field] = raw.get(key, defaults[field])
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ModelConfigError(f"{where}: {key}={value!r} is not a non-negative integer")
    # (Qwen3NextConfig's default renormalises; Qwen3.5-MoE always does)
    default_norm = raw.get("model_type") == "qwen3_next"
    out["norm_topk_prob"] = qwen3_5 or bool(raw.get("norm_topk_prob", default_norm))
    only = raw.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in only
    ):
        raise ModelConfigError(f"{where}: mlp_only_layers={only!r} is not a list of layer numbers")
    out["mlp_only_layers"] = tuple(only)
    return out


def _mixtral_fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """Mixtral's, OLMoE's and gpt-oss's experts as ModelConfig's: every layer sparse, each
    expert an MLP of intermediate_size; Mixtral's top k router weights always renormalised
    (transformers' defaults: 8 experts, 2 a token), OLMoE's as norm_topk_prob says (64
    experts, 8 a token, false), gpt-oss's a softmax over the chosen logits (128 experts, 4 a
    token) and its clamped gate. Mixtral's training-time router jitter and OLMoE's q/k/v
    clipping are refused unless none."""
    out: dict[str, Any] = {}
    olmoe, oss = raw.get("model_type") == "olmoe", raw.get("model_type") == "gpt_oss"
    if olmoe and raw.get("clip_qkv") is not None:
        raise ModelConfigError(f"{where}: clip_qkv={raw['clip_qkv']!r} {ENGINE} (null)")
    count_key, defaults = (("num_experts", (64, 8)) if olmoe else
                           ("num_local_experts", (128, 4) if oss else (8, 2)))
    for field, key, default in (("num_experts", count_key, defaults[0]),
                                ("num_experts_per_tok", "num_experts_per_tok", defaults[1])):
        value = out[field] = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelConfigError(f"{where}: {key}={value!r} is not a positive integer")
    jitter = raw.get("router_jitter_noise") or 0.0
    if jitter:
        raise ModelConfigError(f"{where}: router_jitter_noise={jitter!r} {ENGINE} (0)")
    if oss:  # (a softmax over the chosen logits: their weights sum to 1 already)
        out.update(scoring_func="topk_softmax", norm_topk_prob=False, **{
            key: number(raw.get(key, default), key, where)
            for key, default in (("swiglu_alpha", 1.702), ("swiglu_limit", 7.0))})
        if not out["swiglu_limit"] > 0:
            raise ModelConfigError(f"{where}: swiglu_limit={out['swiglu_limit']!r} is not "
                                   "positive")
        return {**out, "moe_intermediate_size": raw["intermediate_size"]}
    normalize = bool(raw.get("norm_topk_prob", False)) if olmoe else True
    return {**out, "moe_intermediate_size": raw["intermediate_size"], "norm_topk_prob": normalize}


def _deepseek_v3_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """DeepSeek-V3's (and Moonlight's, Kimi K2's) latent attention and experts as ModelConfig's,
    with DeepseekV3Config's defaults where a key is absent: GLM-4.5's router and experts (the
    same math, DeepSeek's first), every layer past ``first_k_dense_replace`` sparse. Its own
    configs' router keys that transformers ignores are checked to say what transformers runs
    (sigmoid scores, noaux_tc choice, every layer sparse), so a DeepSeek-V2-style config is a
    one-line error, not another model."""
    _runs_only("deepseek_v3", where, [(key, raw.get(key, runs), (runs,)) for key, runs in (
        ("scoring_func", "sigmoid"), ("topk_method", "noaux_tc"), ("moe_layer_freq", 1))])
    out = glm4_moe_fields({"n_routed_experts": 256, "moe_intermediate_size": 2048,
                            "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3,
                            "routed_scaling_factor": 2.5, **raw}, layers, where)
    interleave = raw.get("rope_interleave", True)
    if not isinstance(interleave, bool):
        raise ModelConfigError(f"{where}: rope_interleave={interleave!r} is not true or false")
    return {**out, **latent_fields(raw, where), "rope_interleave": interleave}


def _deepseek_v2_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """DeepSeek-V2's (V2-Lite's, Coder-V2's) latent attention and experts, with
    DeepseekV2Config's defaults where a key is absent (or null): V3's attention with its rotary
    pairs always interleaved, a softmax router whose top k are weighed unrenormalised times
    ``routed_scaling_factor``, chosen from all experts ("greedy") or from the ``topk_group``
    groups whose best expert scores highest ("group_limited_greedy"), as transformers runs it.
    ``norm_topk_prob`` true (which transformers' DeepseekV2 ignores and vLLM's reads) is
    refused so both say one thing."""
    method = raw.get("topk_method") or "greedy"
    _runs_only("deepseek_v2", where, [
        ("scoring_func", raw.get("scoring_func", "softmax"), ("softmax",)),
        ("topk_method", method, ("greedy", "group_limited_greedy")),
        ("moe_layer_freq", raw.get("moe_layer_freq", 1), (1,)),
        ("norm_topk_prob", raw.get("norm_topk_prob") or False, (False,))])
    defaults = {"n_routed_experts": 64, "moe_intermediate_size": 1407, "n_shared_experts": 2,
                "first_k_dense_replace": 0, "routed_scaling_factor": 1.0}
    given = {k: v for k, v in raw.items() if v is not None}
    grouped = {"n_group": given.get("n_group", 1), "topk_group": given.get("topk_group", 1)}
    out = glm4_moe_fields({**defaults, **given, "norm_topk_prob": False, **(
        grouped if method == "group_limited_greedy" else {"n_group": 1, "topk_group": 1})},
        layers, where)
    return {**out, **latent_fields({"q_lora_rank": 1536, **raw}, where),
            "scoring_func": "softmax", "rope_interleave": True}


def _runs_only(kind: str, where: str, checks: list[tuple[str, Any, tuple[Any, ...]]]) -> None:
    """Raise ModelConfigError for the first (key, value, what runs) whose value is not one the
    embedded engine runs on ``kind``."""
    for key, value, runs in checks:
        if value not in runs:
            raise ModelConfigError(f"{where}: {key}={value!r} {ENGINE} on {kind} "
                                   f"({', '.join(map(repr, runs))})")


def latent_fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """DeepSeek's latent attention keys (DeepseekV3Config's defaults), and head_dim: a head's
    query and key width, the no-rope part and the rope part."""
    out: dict[str, Any] = {"qk_norm": False}
    q_rank = raw.get("q_lora_rank", 1536)
    for field, value in (("q_lora_rank", 0 if q_rank is None else q_rank),
                         ("kv_lora_rank", raw.get("kv_lora_rank", 512)),
                         ("qk_nope_head_dim", raw.get("qk_nope_head_dim", 128)),
                         ("qk_rope_head_dim", raw.get("qk_rope_head_dim", 64)),
                         ("v_head_dim", raw.get("v_head_dim", 128))):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ModelConfigError(f"{where}: {field}={value!r} is not a non-negative integer")
        out[field] = value
    return {**out, "head_dim": out["qk_nope_head_dim"] + out["qk_rope_head_dim"]}


def deepseek_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """A DeepSeek-V2 or V3 config's own keys: GLM-4.5's expert keys, the latent attention's,
    head_dim as transformers sets it (the rotary part's width), and the router's as DeepSeek's
    configs name it (which vLLM reads)."""
    out = {k: v for k, v in glm4_moe_to_hf(cfg).items()
           if k not in ("use_qk_norm", "partial_rotary_factor", "num_nextn_predict_layers")}
    out.update(q_lora_rank=cfg.q_lora_rank or None, kv_lora_rank=cfg.kv_lora_rank,
               qk_nope_head_dim=cfg.qk_nope_head_dim, qk_rope_head_dim=cfg.qk_rope_head_dim,
               v_head_dim=cfg.v_head_dim, head_dim=cfg.qk_rope_head_dim)
    if cfg.architecture == "deepseek_v2":
        grouped = cfg.n_group > 1
        return {**out, "scoring_func": "softmax", "moe_layer_freq": 1,
                "topk_method": "group_limited_greedy" if grouped else "greedy"}
    return {**out, "rope_interleave": cfg.rope_interleave, "num_nextn_predict_layers": 0,
            **DEEPSEEK_V3_ROUTER}


def glm4_moe_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """GLM-4.5's experts, router and q/k norms as ModelConfig's, with Glm4MoeConfig's defaults
    where a key is absent: its first ``first_k_dense_replace`` layers dense, the rest sparse,
    each with ``n_shared_experts`` shared; a sigmoid router. Its multi-token-prediction layers
    (``num_nextn_predict_layers``) are not part of the decoder: their tensors are left out as
    the folder is read (``hf_layout``), as transformers leaves them."""
    out: dict[str, Any] = counts(raw, where, (
        ("num_experts", "n_routed_experts", 128), ("num_experts_per_tok", "num_experts_per_tok", 8),
        ("moe_intermediate_size", "moe_intermediate_size", 1408),
        ("n_shared_experts", "n_shared_experts", 1), ("n_group", "n_group", 1),
        ("topk_group", "topk_group", 1)))
    dense = raw.get("first_k_dense_replace", 1)
    if isinstance(dense, bool) or not isinstance(dense, int) or not 0 <= dense <= layers:
        raise ModelConfigError(f"{where}: first_k_dense_replace={dense!r} is not a number of "
                               f"layers in [0, {layers}]")
    for key in ("norm_topk_prob", "use_qk_norm"):
        if not isinstance(raw.get(key, False), bool):
            raise ModelConfigError(f"{where}: {key}={raw[key]!r} is not true or false")
    return {**out, "mlp_only_layers": tuple(range(dense)), "scoring_func": "sigmoid",
            "routed_scaling_factor": number(raw.get("routed_scaling_factor", 1.0),
                                             "routed_scaling_factor", where),
            "norm_topk_prob": raw.get("norm_topk_prob", True),
            "qk_norm": raw.get("use_qk_norm", False)}


def granite_moe_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """Granite 3's MoE's own keys: its multipliers and experts (every layer sparse, a softmax
    over the top k logits), granitemoeshared's shared MLP; no token ids (its defaults are a
    bigger vocabulary's)."""
    check_every_layer_sparse(cfg)
    if not cfg.norm_topk_prob or cfg.scoring_func != "softmax":
        raise ModelConfigError(f"a {cfg.architecture} checkpoint routes by a softmax over its "
                               "top k logits")
    out = {key: getattr(cfg, key) for key in GRANITE_KEYS}
    out.update(attention_multiplier=cfg.attention_scale, attention_bias=cfg.attention_bias,
               num_local_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
               output_router_logits=False, pad_token_id=None, bos_token_id=None,
               eos_token_id=None)
    if cfg.architecture == "granitemoeshared":
        out["shared_intermediate_size"] = cfg.shared_intermediate_size
    return out


def glm4_moe_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """A GLM-4.5 config's own keys (no token ids: as for phi3; no multi-token-prediction layer:
    pivotflow holds none)."""
    dense = len(cfg.mlp_only_layers)
    if cfg.mlp_only_layers != tuple(range(dense)) or cfg.decoder_sparse_step != 1:
        raise ModelConfigError(f"a {cfg.architecture} checkpoint has its dense layers first "
                               "(first_k_dense_replace) and every later layer sparse")
    return {"attention_bias": cfg.attention_bias, "use_qk_norm": cfg.qk_norm,
            "partial_rotary_factor": cfg.partial_rotary_factor,
            "n_routed_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
            "moe_intermediate_size": cfg.moe_intermediate_size,
            "n_shared_experts": cfg.n_shared_experts, "n_group": cfg.n_group,
            "topk_group": cfg.topk_group, "routed_scaling_factor": cfg.routed_scaling_factor,
            "norm_topk_prob": cfg.norm_topk_prob, "first_k_dense_replace": dense,
            "num_nextn_predict_layers": 0, "output_router_logits": False,
            "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}


def check_every_layer_sparse(cfg: ModelConfig) -> None:
    """Mixtral's and OLMoE's files say no dense layers and no expert width of their own."""
    if cfg.num_experts and (cfg.moe_intermediate_size != cfg.intermediate_size
                            or cfg.mlp_only_layers or cfg.decoder_sparse_step != 1):
        raise ModelConfigError(
            f"a {cfg.architecture} checkpoint has every layer sparse and experts of "
            "intermediate_size; use architecture='qwen3_moe' for another layout")


# Qwen3_5TextConfig's defaults for its linear layers' keys
_QWEN3_5_LINEAR = {"linear_num_key_heads": 16, "linear_num_value_heads": 32,
                   "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                   "linear_conv_kernel_dim": 4}


def _qwen3_5_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """Qwen3.5's linear layers: those ``layer_types`` marks "linear_attention", else three of
    every ``full_attention_interval`` (4), the last of each group full (Qwen3_5TextConfig's
    rule), and their widths (its defaults where a config names none)."""
    out: dict[str, Any] = {}
    for key, default in _QWEN3_5_LINEAR.items():
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelConfigError(f"{where}: {key}={value!r} is not a positive integer")
        out[key] = value
    types = raw.get("layer_types")
    if types and any(t not in ("linear_attention", "full_attention") for t in types):
        raise ModelConfigError(f"{where}: layer_types={types!r} {ENGINE} on "
                               f"{raw.get('model_type')} (linear_attention, full_attention)")
    if types:  # (hf_windows checked the length)
        out["linear_attention_layers"] = tuple(
            i for i, t in enumerate(types) if t == "linear_attention")
        return out
    every = raw.get("full_attention_interval", 4)
    if isinstance(every, bool) or not isinstance(every, int) or every <= 0:
        raise ModelConfigError(f"{where}: full_attention_interval={every!r} is not a positive "
                               "integer")
    out["linear_attention_layers"] = tuple(i for i in range(layers) if (i + 1) % every)
    return out


def qwen3_5_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """Qwen3.5's and Qwen3-Next's own keys: layer types and linear layers' widths (no token
    ids: as for phi3, in hf_config); the experts of Qwen3.5-MoE (every layer's, the router
    renormalising, a shared expert) and of Qwen3-Next (its dense layers too)."""
    out: dict[str, Any] = {
        "attention_bias": cfg.attention_bias, "pad_token_id": None, "bos_token_id": None,
        "eos_token_id": None, "partial_rotary_factor": cfg.partial_rotary_factor,
        "layer_types": ["linear_attention" if cfg.is_linear(i) else "full_attention"
                        for i in range(cfg.num_hidden_layers)],
        **{key: getattr(cfg, key) for key in _QWEN3_5_LINEAR}}
    if cfg.architecture == "qwen3_5_text":
        return out
    if cfg.architecture == "qwen3_5_moe_text":
        check_every_layer_sparse(cfg)
        if not cfg.norm_topk_prob or not cfg.shared_expert_intermediate_size:
            raise ModelConfigError("a qwen3_5_moe_text checkpoint renormalises its router "
                                   "weights and has a shared expert")
    else:  # (qwen3_next)
        out.update(norm_topk_prob=cfg.norm_topk_prob, decoder_sparse_step=cfg.decoder_sparse_step,
                   mlp_only_layers=list(cfg.mlp_only_layers))
    return {**out, "num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
            "moe_intermediate_size": cfg.moe_intermediate_size,
            "shared_expert_intermediate_size": cfg.shared_expert_intermediate_size,
            "output_router_logits": False}


def _exaone4_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """EXAONE 4.0's: with a window, its full layers turn no position (NoPE)."""
    window = raw.get("sliding_window", 4096) is not None
    sliding = exaone4_sliding(raw, raw.get("layer_types") or [], layers, where)
    return {"nope_layers": tuple(i for i in range(layers) if window and i not in sliding)}


def _arcee_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """Arcee AFM's: Llama's layer, its MLP ungated, relu(x)^2 (Nemotron's)."""
    act = raw.get("hidden_act", "relu2")
    if act != "relu2":
        raise ModelConfigError(f"{where}: hidden_act={act!r} {ENGINE} on arcee (relu2)")
    return {"hidden_act": act}


# a family reader: (config.json, its num_hidden_layers, where) -> ModelConfig fields
_Reader = Callable[[dict[str, Any], int, str], dict[str, Any]]


def _elsewhere(path: str, by_layers: bool = True) -> _Reader:
    """The reader ``module.function`` of pivotflow.engines.torch's family modules, imported
    when first called (they import this module); ``by_layers``: it takes the layer count."""
    module, name = path.split(".")

    def read(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
        reader = getattr(importlib.import_module(f"pivotflow.engines.torch.{module}"), name)
        return reader(raw, layers, where) if by_layers else reader(raw, where)  # type: ignore[no-any-return]

    return read


def _no_layers(reader: Callable[[dict[str, Any], str], dict[str, Any]]) -> _Reader:
    return lambda raw, _layers, where: reader(raw, where)


def _granite_swa_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """Granite's multipliers, and its rope bases per layer (hf_granite_swa)."""
    bases = _elsewhere("hf_granite_swa.granite_swa_fields", by_layers=False)
    return {**_granite_fields(raw, where), **bases(raw, layers, where)}


def _granite_moe_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """Granite 3's MoE (``granitemoe``; ``granitemoeshared`` with a shared MLP beside): its
    multipliers, and on every layer experts of intermediate_size by a softmax over the top k
    logits (GraniteMoeConfig's defaults: 8 experts, 2 a token; no shared MLP)."""
    out = {**_granite_fields(raw, where), **counts(raw, where, (
        ("num_experts", "num_local_experts", 8), ("num_experts_per_tok", "num_experts_per_tok", 2),
        ("shared_intermediate_size", "shared_intermediate_size", 0)))}
    if not (out["num_experts"] and out["num_experts_per_tok"]):
        raise ModelConfigError(f"{where}: num_local_experts={out['num_experts']!r} and "
                               f"num_experts_per_tok={out['num_experts_per_tok']!r} must be "
                               f"positive on {raw.get('model_type')}")
    if raw.get("model_type") == "granitemoe":  # (a key its class does not read)
        out["shared_intermediate_size"] = 0
    return {**out, "moe_intermediate_size": raw["intermediate_size"], "norm_topk_prob": True}


def _qwen3_5_expert_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """Qwen3.5-MoE's and Qwen3-Next's: their linear layers and their experts."""
    return {**_qwen3_5_fields(raw, layers, where), **_expert_fields(raw, where)}


# Each family's reader of the keys of its own (the families not named have none)
_FIELDS: dict[str, _Reader] = {
    **dict.fromkeys(("qwen3_moe", "qwen2_moe"), _no_layers(_expert_fields)),
    **dict.fromkeys(("mixtral", "olmoe", "gpt_oss"), _no_layers(_mixtral_fields)),
    "glm4_moe": glm4_moe_fields,
    "deepseek_v3": _deepseek_v3_fields, "deepseek_v2": _deepseek_v2_fields,
    "smollm3": lambda raw, layers, where: {"nope_layers": nope_layers(raw, layers, where)},
    "granite": _no_layers(_granite_fields), "granite_swa": _granite_swa_fields,
    **dict.fromkeys(("granitemoe", "granitemoeshared"), _granite_moe_fields),
    **dict.fromkeys(("gemma3_text", "gemma2"), _no_layers(_gemma_fields)),
    "gemma4_text": _elsewhere("hf_gemma4.gemma4_fields", by_layers=False),
    **dict.fromkeys(("cohere2", "cohere"), _elsewhere("hf_cohere2.cohere2_fields")),
    "llama4_text": _elsewhere("hf_llama4.llama4_fields"),
    "qwen3_5_text": _qwen3_5_fields,
    **dict.fromkeys(("qwen3_5_moe_text", "qwen3_next"), _qwen3_5_expert_fields),
    "granitemoehybrid": _elsewhere("hf_granite.granite_fields"),
    "nemotron_h": _elsewhere("hf_nemotron.nemotron_fields", by_layers=False),
    "minimax_m2": _elsewhere("hf_minimax.minimax_fields", by_layers=False),
    "exaone4": _exaone4_fields,
    "dots1": _elsewhere("hf_dots.dots_fields"),
    "glm4_moe_lite": _elsewhere("hf_glm_lite.glm_lite_fields"),
    "arcee": _arcee_fields,
    "minicpm5_moe": _elsewhere("hf_minicpm5.minicpm5_fields"),
    "hy_v3": _elsewhere("hf_hy_v3.hy_v3_fields"),
    "apertus": lambda *_: {"hidden_act": "xielu"},  # (checked by hf_apertus)
    "afmoe": _elsewhere("hf_afmoe.afmoe_fields"),
    "solar_open": _elsewhere("hf_solar_open.solar_open_fields"),
    "mistral4": _elsewhere("hf_mistral4.mistral4_fields"),
    "ministral3": _elsewhere("hf_ministral.ministral_fields", by_layers=False),
    "ernie4_5_moe": _elsewhere("hf_ernie.ernie_moe_fields"),
    "hunyuan_v1_moe": _elsewhere("hf_hunyuan.hunyuan_moe_fields", by_layers=False),
    **dict.fromkeys(("lfm2", "lfm2_moe"), _elsewhere("hf_lfm2.lfm2_fields", by_layers=False)),
    "olmo_hybrid": _elsewhere("hf_olmo_hybrid.olmo_hybrid_fields"),
}
