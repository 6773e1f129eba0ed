"""Hugging Face ``config.json`` -> ``ModelConfig``, and the dtype a model runs in (the way
back: ``hf_config_write``; rope: ``hf_rope``).

``config_from_hf`` accepts what the embedded decoder computes exactly as transformers does
(Qwen2/Qwen2.5, Llama 3, Mistral, Qwen3, Qwen3-MoE, OLMo-2, OLMo-3, Gemma 3's text model,
Phi-3/Phi-4, Mixtral, GLM-4, GLM-4.5, SmolLM3, Qwen2-MoE, Gemma 2, OLMoE, Granite, gpt-oss,
DeepSeek-V2, DeepSeek-V3, Qwen3.5, Qwen3-Next, Granite 4.0 and 4.0-H, Nemotron-H,
MiniMax-M2, OLMo Hybrid, EXAONE 4.0, ERNIE 4.5 and its MoE, LFM2, Seed-OSS, Ministral 3, GLM-4.7-Flash,
LFM2-MoE, dots.llm1, Hunyuan and Hunyuan-MoE, Llama 4;
rope default, linear, llama3, yarn,
Phi-3's longrope within its original context; sliding windows as each family says them,
``hf_windows``; each family's own keys, ``hf_families``; unquantized weights, block-wise FP8's and gpt-oss's MXFP4, dequantized
as read) and names, in one line, the file and the first key it cannot run. Keys that change
nothing the decoder computes (token ids, initializer_range, use_cache...) are ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pivotflow.engines.torch.architectures import ARCHITECTURES
from pivotflow.engines.torch.hf_afmoe import afmoe_keys
from pivotflow.engines.torch.hf_apertus import apertus_keys
from pivotflow.engines.torch.hf_cohere2 import cohere2_keys
from pivotflow.engines.torch.hf_config_write import (
    HF_CLASSES,
    HF_CLASSIFIERS,
    REQUIRED,
    config_to_hf,
)
from pivotflow.engines.torch.hf_ernie import ernie_keys
from pivotflow.engines.torch.hf_families import ENGINE, family_fields, number
from pivotflow.engines.torch.hf_gemma4 import gemma4_keys
from pivotflow.engines.torch.hf_glm_lite import glm_lite_keys
from pivotflow.engines.torch.hf_granite import KIND, granite_layer_types
from pivotflow.engines.torch.hf_granite_swa import granite_swa_keys
from pivotflow.engines.torch.hf_hunyuan import hunyuan_keys
from pivotflow.engines.torch.hf_hy_v3 import hy_v3_keys
from pivotflow.engines.torch.hf_lfm2 import lfm2_keys
from pivotflow.engines.torch.hf_llama4 import llama4_keys
from pivotflow.engines.torch.hf_minicpm5 import minicpm5_keys
from pivotflow.engines.torch.hf_minimax import minimax_keys
from pivotflow.engines.torch.hf_ministral import ministral_keys
from pivotflow.engines.torch.hf_mistral4 import mistral4_keys
from pivotflow.engines.torch.hf_nemotron import nemotron_blocks
from pivotflow.engines.torch.hf_olmo_hybrid import olmo_hybrid_keys
from pivotflow.engines.torch.hf_rope import PARTIAL_ROTARY_FAMILIES, rope_fields, rope_key
from pivotflow.engines.torch.hf_seed_oss import seed_oss_keys
from pivotflow.engines.torch.hf_solar_open import solar_open_keys
from pivotflow.engines.torch.hf_windows import split_layer_rope, window_fields
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.errors import ModelConfigError
from pivotflow.params.fp8_blocks import is_fp8_blocks
from pivotflow.params.mxfp4 import is_mxfp4

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}  # fmt: skip

# GptOssConfig's rope when a config names none
_GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                 "truncate": False, "original_max_position_embeddings": 4096}


def resolve_dtype(
    hf_config: dict[str, Any],
    requested: str | torch.dtype | None,
    where: str = "config.json",
) -> torch.dtype:
    """The dtype to run in: ``requested`` (float32|bfloat16|float16|fp32|bf16|fp16), or for
    None/"auto" the config's ``dtype``/``torch_dtype`` (float32 when it has neither). Raises
    ModelConfigError naming the bad value (and ``where`` for the config's)."""
    if isinstance(requested, torch.dtype):
        requested = str(requested).removeprefix("torch.")
    if requested not in (None, "auto"):
        if requested not in DTYPES:
            raise ModelConfigError(f"dtype={requested!r} is not one of auto, {', '.join(DTYPES)}")
        return DTYPES[requested]
    key = "dtype" if hf_config.get("dtype") else "torch_dtype"
    name = hf_config.get(key) or "float32"
    if name not in DTYPES:
        raise ModelConfigError(f"{where}: {key}={name!r} {ENGINE} (float32, bfloat16, float16)")
    return DTYPES[name]


def _model_type(raw: dict[str, Any], where: str) -> str:
    kind = raw.get("model_type")
    if kind is None:  # very old exports name only the class
        archs = raw.get("architectures") or []
        kind = next((k for k, cls in (*HF_CLASSES.items(), *HF_CLASSIFIERS.items())
                     if cls in archs), None)
    if kind not in ARCHITECTURES:
        raise ModelConfigError(
            f"{where}: model_type={kind!r} {ENGINE} (`pivotflow model --families` lists the "
            f"{len(ARCHITECTURES)} decoders and the multimodal wrappers it runs)"
        )
    return str(kind)


def _reject_unsupported(raw: dict[str, Any], where: str) -> None:
    """Raise for the first key whose value asks for math this decoder does not do."""
    # (Gemma's hidden_activation's gate; Nemotron-H's mlp_hidden_act, hf_nemotron's; Arcee's
    # relu2, hf_families'; Apertus's xielu, hf_apertus')
    gemma = raw.get("model_type") in ("gemma3_text", "gemma2", "nemotron_h", "arcee", "apertus",
                                      "gemma4_text")
    # (Phi-3's and GLM-4's attention rotates part of each head)
    partial_ok = raw.get("model_type") in PARTIAL_ROTARY_FAMILIES
    checks = [  # (key, it asks for something else, what runs)
        ("hidden_act", not gemma and raw.get("hidden_act", "silu") != "silu", "silu"),
        ("mlp_bias", bool(raw.get("mlp_bias", False)), "false"),
        ("partial_rotary_factor",
         not partial_ok and raw.get("partial_rotary_factor", 1.0) != 1.0, "1.0"),
        # (gpt-oss's MXFP4 experts are dequantized as the folder is read: hf_layout)
        ("quantization_config", bool(raw.get("quantization_config")) and not (
            raw.get("model_type") == "gpt_oss" and is_mxfp4(raw)) and not is_fp8_blocks(raw),
         "unquantized weights, block-wise FP8, or gpt-oss's MXFP4"),
    ]
    for key, bad, runs in checks:
        if bad:
            raise ModelConfigError(f"{where}: {key}={raw.get(key)!r} {ENGINE} ({runs})")


def with_context(raw: dict[str, Any], context: int, where: str) -> dict[str, Any]:
    """``raw`` (a config.json) serving ``context`` positions: its max_position_embeddings
    replaced (RoPE has no learned positions). LongRoPE derives its factor, and so its attention
    factor, from max_position_embeddings when the config names none: that factor is written
    in first, so the model computes what it did."""
    cfg = config_from_hf(raw, where)
    out = {**raw, "max_position_embeddings": context}
    if cfg.rope_type == "longrope":
        key = rope_key(raw)
        out[key] = {**raw[key], "factor": cfg.rope_factor}
    return out


def _granite_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    return granite_layer_types(raw, _positive_int(raw, "num_hidden_layers", where), where)


# a family's config said as config_from_hf reads every family's: its own names for shared
# keys, its config class's defaults where they differ, its checks (raw, where -> raw)
_OWN_KEYS: dict[str, Callable[[dict[str, Any], str], dict[str, Any]]] = {
    KIND: _granite_keys,  # (Granite 4.0's layer names, and its dense MLP's width)
    "nemotron_h": nemotron_blocks,  # (its blocks, and its own names for shared keys)
    "minimax_m2": minimax_keys,  # (its head width and rotary_dim, its remote code's keys)
    "olmo_hybrid": lambda raw, _: olmo_hybrid_keys(raw),  # (its null rope_theta: no rope)
    # (Exaone4Config's and ArceeConfig's norm epsilon)
    "exaone4": lambda raw, _: {**raw, "rms_norm_eps": raw.get("rms_norm_eps", 1e-5)},
    "arcee": lambda raw, _: {**raw, "rms_norm_eps": raw.get("rms_norm_eps", 1e-5)},
    "lfm2": lfm2_keys, "lfm2_moe": lfm2_keys,  # (its epsilon's and tying's names, MLP width)
    "hunyuan_v1_dense": hunyuan_keys, "hunyuan_v1_moe": hunyuan_keys,  # (alpha rope: a base)
    "seed_oss": seed_oss_keys,  # (heads of 128; its o_proj unbiased)
    "glm4_moe_lite": lambda raw, _: glm_lite_keys(raw),  # (Glm4MoeLiteConfig's defaults)
    "ministral3": lambda raw, _: ministral_keys(raw),  # (its rope, heads of 128)
    "solar_open": solar_open_keys,  # (SolarOpenConfig's defaults)
    "afmoe": afmoe_keys,
    "apertus": apertus_keys,  # (its xIELU, its epsilon and rope)
    "hy_v3": hy_v3_keys,  # (HYV3Config's defaults)
    "granite_swa": granite_swa_keys,
    "minicpm5_moe": minicpm5_keys,  # (its defaults, its dense layers' old name)  # (its defaults, its full layers' rope base)  # (AfmoeConfig's defaults, the released configs' router keys)
    "mistral4": mistral4_keys,  # (Mistral4Config's defaults, its head_dim the query's width)
    "gemma4_text": gemma4_keys,  # (Gemma4TextConfig's defaults, its layer types and ropes)
    # (CohereConfig's and Cohere2Config's defaults, their epsilon, head width, layers)
    "cohere2": cohere2_keys, "cohere": cohere2_keys,
    # (Llama4TextConfig's defaults; its dense and expert widths, chunks as windows)
    "llama4_text": llama4_keys,
    "ernie4_5": ernie_keys, "ernie4_5_moe": ernie_keys,  # (heads of 128, its epsilon)
}


def _positive_int(raw: dict[str, Any], key: str, where: str) -> int:
    if key not in raw:
        raise ModelConfigError(f"{where}: required key {key!r} is missing")
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelConfigError(f"{where}: {key}={value!r} is not a positive integer")
    return value


def config_from_hf(raw: dict[str, Any], where: str) -> ModelConfig:
    """Map a Hugging Face ``config.json`` of one of ARCHITECTURES onto ModelConfig. Raises
    ModelConfigError naming ``where`` and the key for a missing field or a feature this decoder
    does not have (another rope or layer type, a biased MLP, another activation...)."""
    kind = _model_type(raw, where)
    _reject_unsupported(raw, where)
    if kind in _OWN_KEYS:
        raw = _OWN_KEYS[kind](raw, where)
    full_layers, sliding_theta = split_layer_rope(raw, kind, where)
    if kind == "gpt_oss" and not (raw.get("rope_parameters") or raw.get("rope_scaling")):
        full_layers = {**full_layers, "rope_parameters": _GPT_OSS_ROPE}
    if kind == "qwen3_5_moe_text":
        # (every layer sparse: Qwen3.5-MoE has no dense MLP, and transformers reads no
        # intermediate_size there; ModelConfig's is the experts' width, as Mixtral's)
        raw = {**raw, "intermediate_size": raw.get("moe_intermediate_size", 512)}
    fields: dict[str, Any] = {k: _positive_int(raw, k, where) for k in REQUIRED}
    rope = rope_fields(full_layers, where)
    fields.update(window_fields(raw, kind, fields["num_hidden_layers"], where))
    if sliding_theta is not None:
        fields["sliding_rope_theta"] = sliding_theta
    heads = fields["num_attention_heads"]
    for key in ("num_key_value_heads", "head_dim"):
        if raw.get(key) is not None:  # null means "derive", as in transformers
            fields[key] = _positive_int(raw, key, where)
    if kind == "glm4":  # (Glm4Config's head_dim is 128, not hidden / heads)
        fields.setdefault("head_dim", 128)
    if kind in ("deepseek_v3", "deepseek_v2", "glm4_moe_lite"):  # (the rotary part's width)
        fields.pop("head_dim", None)
    fields.setdefault("num_key_value_heads", heads)  # transformers' default: no GQA
    if "head_dim" not in fields and fields["hidden_size"] % heads:
        raise ModelConfigError(
            f"{where}: hidden_size {fields['hidden_size']} is not divisible by "
            f"num_attention_heads {heads} and there is no head_dim"
        )
    cfg = ModelConfig(
        **fields,
        **rope,
        rms_norm_eps=number(raw.get("rms_norm_eps", 1e-6), "rms_norm_eps", where),
        # (transformers' default: tied for Gemma 2 and 3 and SmolLM3, untied for the rest)
        tie_word_embeddings=bool(raw.get("tie_word_embeddings",
                                         kind in ("gemma3_text", "gemma2", "smollm3",
                                                  "ernie4_5", "ernie4_5_moe", "lfm2_moe"))),
        # Qwen2 always has q/k/v biases; Mistral, Mixtral and Phi-3 never; Llama and Qwen3
        # when the config says so.
        attention_bias={"qwen2": True, "mistral": False, "phi3": False, "mixtral": False,
                        "ministral3": False,
                        "qwen2_moe": bool(raw.get("qkv_bias", True))}.get(
            kind, bool(raw.get("attention_bias", kind in ("glm4", "gpt_oss", "seed_oss")))),
        architecture=kind,
        num_labels=_num_labels(raw, where),
        **family_fields(raw, kind, fields["num_hidden_layers"], where),
    )
    try:
        return cfg.validate()
    except ModelConfigError as exc:
        raise ModelConfigError(f"{where}: {exc}") from None


def _num_labels(raw: dict[str, Any], where: str) -> int:
    """A ``*ForSequenceClassification`` config's outputs (``num_labels``, else its
    ``id2label``'s size, else transformers' default of 2); 0 for a causal LM."""
    archs = raw.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in archs):
        return 0
    n = raw.get("num_labels", len(raw.get("id2label") or {}) or 2)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ModelConfigError(f"{where}: num_labels={n!r} is not a positive integer")
    return n




__all__ = ["DTYPES", "HF_CLASSES", "HF_CLASSIFIERS", "config_from_hf", "config_to_hf",
           "resolve_dtype", "with_context"]
