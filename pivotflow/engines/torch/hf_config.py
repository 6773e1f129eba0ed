"""Hugging Face ``config.json`` <-> ``ModelConfig``, and the dtype a model runs in.

``config_from_hf`` accepts what the embedded decoder computes exactly as transformers does
(Qwen2/Qwen2.5, Llama 3, Mistral, Qwen3, Qwen3-MoE, OLMo-2, OLMo-3, Gemma 3's text model,
Phi-3/Phi-4, Mixtral, GLM-4, GLM-4.5, SmolLM3, Qwen2-MoE, Gemma 2, OLMoE, Granite, gpt-oss,
DeepSeek-V2, DeepSeek-V3, Qwen3.5, Qwen3-Next, Granite 4.0 and 4.0-H, Nemotron-H, MiniMax-M2, OLMo Hybrid, EXAONE 4.0, ERNIE 4.5, LFM2; rope default, linear, llama3, yarn, Phi-3's longrope within its
original context; sliding windows as each family says them, ``hf_windows``; each family's own
keys, ``hf_families``; unquantized weights, block-wise FP8's and gpt-oss's MXFP4, dequantized
as read) and names, in one line, the file and the first key it cannot run. Keys that change
nothing the decoder computes (token ids, initializer_range, use_cache...) are ignored.
"""

from __future__ import annotations

from typing import Any

import torch

from pivotflow.engines.torch.hf_families import (
    ENGINE,
    GRANITE_KEYS,
    check_every_layer_sparse,
    deepseek_to_hf,
    family_fields,
    glm4_moe_to_hf,
    number,
    qwen3_5_to_hf,
)
from pivotflow.engines.torch.hf_granite import KIND, granite_layer_types, granite_to_hf
from pivotflow.engines.torch.hf_lfm2 import lfm2_keys, lfm2_to_hf
from pivotflow.engines.torch.hf_minimax import minimax_keys, minimax_to_hf
from pivotflow.engines.torch.hf_nemotron import nemotron_blocks, nemotron_to_hf
from pivotflow.engines.torch.hf_olmo_hybrid import olmo_hybrid_keys, olmo_hybrid_to_hf
from pivotflow.engines.torch.hf_windows import split_layer_rope, window_fields, windows_to_hf
from pivotflow.engines.torch.model_config import (
    ARCHITECTURES,
    ROPE_TYPES,
    ModelConfig,
)
from pivotflow.errors import ModelConfigError
from pivotflow.params.fp8_blocks import is_fp8_blocks
from pivotflow.params.mxfp4 import is_mxfp4

HF_CLASSES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM",
              "mistral": "MistralForCausalLM", "qwen3": "Qwen3ForCausalLM",
              "qwen3_moe": "Qwen3MoeForCausalLM", "olmo2": "Olmo2ForCausalLM",
              "olmo3": "Olmo3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
              "phi3": "Phi3ForCausalLM", "mixtral": "MixtralForCausalLM",
              "glm4": "Glm4ForCausalLM", "glm4_moe": "Glm4MoeForCausalLM",
              "smollm3": "SmolLM3ForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
              "gemma2": "Gemma2ForCausalLM", "olmoe": "OlmoeForCausalLM",
              "granite": "GraniteForCausalLM", "gpt_oss": "GptOssForCausalLM",
              "deepseek_v3": "DeepseekV3ForCausalLM",
              "deepseek_v2": "DeepseekV2ForCausalLM",
              "qwen3_5_text": "Qwen3_5ForCausalLM",
              "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
              "qwen3_next": "Qwen3NextForCausalLM",
              "granitemoehybrid": "GraniteMoeHybridForCausalLM",
              "nemotron_h": "NemotronHForCausalLM",
              "minimax_m2": "MiniMaxM2ForCausalLM",
              "olmo_hybrid": "OlmoHybridForCausalLM",
              "exaone4": "Exaone4ForCausalLM",
              "ernie4_5": "Ernie4_5ForCausalLM",
              "lfm2": "Lfm2ForCausalLM"}  # fmt: skip
# the same decoders with a ``score`` head over the last token (reward models)
HF_CLASSIFIERS = {"qwen2": "Qwen2ForSequenceClassification",
                  "llama": "LlamaForSequenceClassification",
                  "mistral": "MistralForSequenceClassification",
                  "qwen3": "Qwen3ForSequenceClassification",
                  "qwen3_moe": "Qwen3MoeForSequenceClassification",
                  "olmo2": "Olmo2ForSequenceClassification",
                  "olmo3": "Olmo3ForSequenceClassification",
                  "gemma3_text": "Gemma3TextForSequenceClassification",
                  "phi3": "Phi3ForSequenceClassification",
                  "mixtral": "MixtralForSequenceClassification",
                  "glm4": "Glm4ForSequenceClassification",
                  "smollm3": "SmolLM3ForSequenceClassification",
                  "qwen2_moe": "Qwen2MoeForSequenceClassification",
                  "gemma2": "Gemma2ForSequenceClassification",
                  "gpt_oss": "GptOssForSequenceClassification",
                  "deepseek_v3": "DeepseekV3ForSequenceClassification",
                  "deepseek_v2": "DeepseekV2ForSequenceClassification",
                  "qwen3_5_text": "Qwen3_5TextForSequenceClassification",
                  "qwen3_next": "Qwen3NextForSequenceClassification",
                  "exaone4": "Exaone4ForSequenceClassification"}
# (transformers has no sequence classifier for glm4_moe, olmoe, granite, granitemoehybrid or
# qwen3_5_moe_text: no
# critic from them)
DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}  # fmt: skip
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "max_position_embeddings")  # fmt: skip
# (transformers' other families turn whole heads)
PARTIAL_ROTARY_FAMILIES = ("phi3", "glm4", "glm4_moe", "qwen3_5_text", "qwen3_5_moe_text",
                           "qwen3_next", "minimax_m2")
# the share of each head that rotates where a config names none (Glm4Config's and Glm4MoeConfig's
# half, Qwen3_5TextConfig's quarter; the others' whole head)
_DEFAULT_PARTIAL = {"glm4": 0.5, "glm4_moe": 0.5, "qwen3_5_text": 0.25,
                    "qwen3_5_moe_text": 0.25, "qwen3_next": 0.25}
# (SmolLM3Config's and GptOssConfig's; the others' is 10000)
_DEFAULT_THETA = {"smollm3": 2000000.0, "gpt_oss": 150000.0, "minimax_m2": 5000000.0,
                  "ernie4_5": 500000.0}
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
            f"{where}: model_type={kind!r} {ENGINE} ({', '.join(ARCHITECTURES)})"
        )
    return str(kind)


def _reject_unsupported(raw: dict[str, Any], where: str) -> None:
    """Raise for the first key whose value asks for math this decoder does not do."""
    # (Gemma's hidden_activation's gate; Nemotron-H's mlp_hidden_act, hf_nemotron's)
    gemma = raw.get("model_type") in ("gemma3_text", "gemma2", "nemotron_h")
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


def _rope_key(raw: dict[str, Any]) -> str:
    """Where a config keeps its rope dict: transformers 5 writes ``rope_parameters``, older
    configs ``rope_scaling``; with both, transformers 5 takes ``rope_scaling``."""
    return "rope_scaling" if raw.get("rope_scaling") else "rope_parameters"


def _rope_fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """ModelConfig's rope_* fields (and partial_rotary_factor). transformers 5 writes
    ``rope_parameters``; older configs ``rope_scaling`` (None for plain RoPE) next to
    ``rope_theta``. When both are there, transformers 5 takes ``rope_scaling``, and so do we.
    Phi-3 alone rotates part of each head and alone reads LongRoPE (its old names ``su`` and
    ``yarn`` mean it there, as transformers' Phi3Config reads them)."""
    key = _rope_key(raw)
    rope = raw.get(key) or {}
    if not isinstance(rope, dict) or any(isinstance(v, dict) for v in rope.values()):
        raise ModelConfigError(f"{where}: {key}={rope!r} {ENGINE} (one dict for all layers)")
    type_key = "rope_type" if "rope_type" in rope else "type"
    kind = rope.get(type_key, "default")
    kind_of = str(raw.get("model_type"))
    phi3 = kind_of == "phi3"
    if phi3 and kind in ("su", "yarn"):
        kind = "longrope"
    if kind not in ROPE_TYPES or (kind == "longrope" and not phi3):
        raise ModelConfigError(
            f"{where}: {key}.{type_key}={kind!r} {ENGINE} "
            f"({', '.join(t for t in ROPE_TYPES if t != 'longrope')}; longrope on phi3)"
        )
    partial = rope.get("partial_rotary_factor", raw.get("partial_rotary_factor",
                                                        _DEFAULT_PARTIAL.get(kind_of, 1.0)))
    if partial != 1.0 and raw.get("model_type") not in PARTIAL_ROTARY_FAMILIES:
        raise ModelConfigError(
            f"{where}: {key}.partial_rotary_factor={partial!r} {ENGINE} (1.0)")
    theta_key = f"{key}.rope_theta" if "rope_theta" in rope else "rope_theta"
    # (transformers' default_theta where the config names none)
    theta = rope.get("rope_theta", raw.get("rope_theta", _DEFAULT_THETA.get(
        raw.get("model_type", ""), 10000.0)))
    out: dict[str, Any] = {"rope_type": kind, "rope_theta": number(theta, theta_key, where)}
    needs = {"linear": ("factor",), "yarn": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor")}.get(kind, ())  # fmt: skip
    for name in needs:
        if name not in rope:
            raise ModelConfigError(f"{where}: {key}.{name} is missing (rope_type {kind!r})")
        out[f"rope_{name}"] = number(rope[name], f"{key}.{name}", where)
    if kind in ("llama3", "yarn"):
        # transformers' default for a missing original length is max_position_embeddings.
        original = rope.get("original_max_position_embeddings",
                            raw.get("original_max_position_embeddings", 0))  # fmt: skip
        out["rope_original_max_position_embeddings"] = int(
            number(original, f"{key}.original_max_position_embeddings", where)
        )
    if kind == "yarn":
        out.update(_yarn_fields(rope, key, where))
    if kind == "longrope":
        out.update(_longrope_fields(raw, rope, key, where))
    if partial != 1.0:
        out["partial_rotary_factor"] = number(partial, "partial_rotary_factor", where)
    return out


def with_context(raw: dict[str, Any], context: int, where: str) -> dict[str, Any]:
    """``raw`` (a config.json) serving ``context`` positions: its max_position_embeddings
    replaced (RoPE has no learned positions). LongRoPE derives its factor, and so its attention
    factor, from max_position_embeddings when the config names none: that factor is written
    in first, so the model computes what it did."""
    cfg = config_from_hf(raw, where)
    out = {**raw, "max_position_embeddings": context}
    if cfg.rope_type == "longrope":
        key = _rope_key(raw)
        out[key] = {**raw[key], "factor": cfg.rope_factor}
    return out


def _longrope_fields(raw: dict[str, Any], rope: dict[str, Any], key: str,
                     where: str) -> dict[str, Any]:
    """LongRoPE's factors, original context (Phi3Config's default 4096), ``factor`` (else
    max_position_embeddings / original, as transformers derives it) and attention factor."""
    out: dict[str, Any] = {}
    for name in ("short_factor", "long_factor"):
        factors = rope.get(name)
        if not isinstance(factors, list) or not factors or not all(
                isinstance(f, int | float) and not isinstance(f, bool) and f > 0
                for f in factors):
            raise ModelConfigError(f"{where}: {key}.{name} is not a list of positive numbers")
        out[f"rope_{name}"] = tuple(float(f) for f in factors)
    original = rope.get("original_max_position_embeddings",
                        raw.get("original_max_position_embeddings", 4096))
    if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
        raise ModelConfigError(f"{where}: original_max_position_embeddings={original!r} is not "
                               "a positive integer")
    out["rope_original_max_position_embeddings"] = original
    factor = rope.get("factor")
    out["rope_factor"] = (number(factor, f"{key}.factor", where) if factor is not None
                          else raw["max_position_embeddings"] / original)
    if rope.get("attention_factor") is not None:
        out["rope_attention_factor"] = number(rope["attention_factor"],
                                               f"{key}.attention_factor", where)
    return out


def _yarn_fields(rope: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """YaRN's optional keys; null or absent takes transformers' default (beta_fast 32, beta_slow
    1, attention_factor derived from factor/mscale/mscale_all_dim, truncate true)."""
    out: dict[str, Any] = {}
    for name in ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim"):
        if rope.get(name) is not None:
            out[f"rope_{name}"] = number(rope[name], f"{key}.{name}", where)
    truncate = rope.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ModelConfigError(f"{where}: {key}.truncate={truncate!r} is not true or false")
    out["rope_truncate"] = truncate
    return out


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
    if kind == KIND:  # (Granite 4.0's layer names, and its dense MLP's width)
        raw = granite_layer_types(raw, _positive_int(raw, "num_hidden_layers", where), where)
    if kind == "nemotron_h":  # (its blocks, and its own names for shared keys)
        raw = nemotron_blocks(raw, where)
    if kind == "minimax_m2":  # (its head width and rotary_dim, its remote code's keys)
        raw = minimax_keys(raw, where)
    if kind == "olmo_hybrid":  # (its null rope_theta: no rope)
        raw = olmo_hybrid_keys(raw)
    if kind == "exaone4":  # (Exaone4Config's norm epsilon)
        raw = {**raw, "rms_norm_eps": raw.get("rms_norm_eps", 1e-5)}
    if kind == "lfm2":  # (its epsilon's and tying's names, its MLP's real width)
        raw = lfm2_keys(raw, where)
    if kind == "ernie4_5":  # (Ernie4_5Config's defaults: heads of 128, its epsilon)
        if raw.get("use_bias"):
            raise ModelConfigError(f"{where}: use_bias={raw['use_bias']!r} {ENGINE} on "
                                   "ernie4_5 (false)")
        raw = {**raw, "head_dim": raw.get("head_dim") or 128,
               "rms_norm_eps": raw.get("rms_norm_eps", 1e-5)}
    full_layers, sliding_theta = split_layer_rope(raw, kind, where)
    if kind == "gpt_oss" and not (raw.get("rope_parameters") or raw.get("rope_scaling")):
        full_layers = {**full_layers, "rope_parameters": _GPT_OSS_ROPE}
    if kind == "qwen3_5_moe_text":
        # (every layer sparse: Qwen3.5-MoE has no dense MLP, and transformers reads no
        # intermediate_size there; ModelConfig's is the experts' width, as Mixtral's)
        raw = {**raw, "intermediate_size": raw.get("moe_intermediate_size", 512)}
    fields: dict[str, Any] = {k: _positive_int(raw, k, where) for k in _REQUIRED}
    rope = _rope_fields(full_layers, where)
    fields.update(window_fields(raw, kind, fields["num_hidden_layers"], where))
    if sliding_theta is not None:
        fields["sliding_rope_theta"] = sliding_theta
    heads = fields["num_attention_heads"]
    for key in ("num_key_value_heads", "head_dim"):
        if raw.get(key) is not None:  # null means "derive", as in transformers
            fields[key] = _positive_int(raw, key, where)
    if kind == "glm4":  # (Glm4Config's head_dim is 128, not hidden / heads)
        fields.setdefault("head_dim", 128)
    if kind in ("deepseek_v3", "deepseek_v2"):  # (transformers writes the rotary part's width)
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
                                                  "ernie4_5"))),
        # Qwen2 always has q/k/v biases; Mistral, Mixtral and Phi-3 never; Llama and Qwen3
        # when the config says so.
        attention_bias={"qwen2": True, "mistral": False, "phi3": False, "mixtral": False,
                        "qwen2_moe": bool(raw.get("qkv_bias", True))}.get(
            kind, bool(raw.get("attention_bias", kind in ("glm4", "gpt_oss")))),  # (default on)
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


def config_to_hf(cfg: ModelConfig, dtype: torch.dtype) -> dict[str, Any]:
    """The ``config.json`` transformers needs to rebuild ``cfg``."""
    cfg.validate()
    if cfg.architecture == "qwen2" and not cfg.attention_bias:
        raise ModelConfigError(
            "a qwen2 checkpoint always has q/k/v biases; use architecture='llama' for a model "
            "with attention_bias=False"
        )
    if cfg.architecture == "mistral" and cfg.attention_bias:
        raise ModelConfigError(
            "a mistral checkpoint has no attention biases; use architecture='llama' for a model "
            "with attention_bias=True"
        )
    dtype_name = str(dtype).removeprefix("torch.")
    rope: dict[str, Any] = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta}
    if cfg.rope_type != "default":
        rope["factor"] = cfg.rope_factor
    if cfg.rope_type in ("llama3", "yarn"):
        rope["original_max_position_embeddings"] = (
            cfg.rope_original_max_position_embeddings or cfg.max_position_embeddings)
    if cfg.rope_type == "llama3":
        rope.update(low_freq_factor=cfg.rope_low_freq_factor,
                    high_freq_factor=cfg.rope_high_freq_factor)
    if cfg.rope_type == "yarn":
        rope.update(beta_fast=cfg.rope_beta_fast, beta_slow=cfg.rope_beta_slow,
                    truncate=cfg.rope_truncate)
        # absent (not 0) where ModelConfig derives them, so transformers derives them alike
        rope.update({name: value for name in ("attention_factor", "mscale", "mscale_all_dim")
                     if (value := getattr(cfg, f"rope_{name}"))})
    if cfg.rope_type == "longrope":  # (factor written: transformers would derive it alike)
        rope.update(short_factor=list(cfg.rope_short_factor),
                    long_factor=list(cfg.rope_long_factor),
                    original_max_position_embeddings=cfg.context_limit)
        if cfg.rope_attention_factor:
            rope["attention_factor"] = cfg.rope_attention_factor
    if cfg.partial_rotary_factor != 1.0:
        rope["partial_rotary_factor"] = cfg.partial_rotary_factor
    classes = HF_CLASSIFIERS if cfg.num_labels else HF_CLASSES
    out: dict[str, Any] = {
        "architectures": [classes[cfg.architecture]],
        "model_type": cfg.architecture,
        **{
            f: getattr(cfg, f)
            for f in (
                *_REQUIRED,
                "num_key_value_heads",
                "head_dim",
                "rms_norm_eps",
                "tie_word_embeddings",
            )
        },  # fmt: skip
        "hidden_act": cfg.hidden_act,
        # transformers 4.x reads rope_theta, 5.x reads rope_parameters: write both.
        "rope_theta": cfg.rope_theta,
        "rope_parameters": rope,
        "torch_dtype": dtype_name,
        "dtype": dtype_name,
        "use_cache": True,
    }
    if cfg.num_labels:
        out.update(num_labels=cfg.num_labels,
                   id2label={str(i): f"LABEL_{i}" for i in range(cfg.num_labels)},
                   label2id={f"LABEL_{i}": i for i in range(cfg.num_labels)})
    if cfg.architecture in ("llama", "olmo2", "olmo3", "granite"):
        out.update(attention_bias=cfg.attention_bias, mlp_bias=False)
        if cfg.architecture == "granite":
            out.update({key: getattr(cfg, key) for key in GRANITE_KEYS},
                       attention_multiplier=cfg.attention_scale)
    elif cfg.architecture in ("gemma3_text", "gemma2"):
        del out["hidden_act"]
        out.update(attention_bias=cfg.attention_bias, hidden_activation=cfg.hidden_act,
                   query_pre_attn_scalar=(int(cfg.query_pre_attn_scalar)  # (an int there)
                                          if cfg.query_pre_attn_scalar.is_integer()
                                          else cfg.query_pre_attn_scalar),
                   final_logit_softcapping=cfg.final_logit_softcapping or None,
                   attn_logit_softcapping=cfg.attn_logit_softcapping or None,
                   use_bidirectional_attention=False)
    elif cfg.architecture == "mistral":
        out.update(sliding_window=None)  # none, explicitly: transformers' default is 4096
    elif cfg.architecture == "gpt_oss":  # (no token ids: as for phi3, below)
        check_every_layer_sparse(cfg)
        out.update(attention_bias=cfg.attention_bias, num_local_experts=cfg.num_experts,
                   num_experts_per_tok=cfg.num_experts_per_tok, swiglu_alpha=cfg.swiglu_alpha,
                   swiglu_limit=cfg.swiglu_limit, output_router_logits=False,
                   pad_token_id=None, bos_token_id=None, eos_token_id=None)
    elif cfg.architecture == "olmoe":
        check_every_layer_sparse(cfg)
        out.update(attention_bias=cfg.attention_bias, clip_qkv=None, num_experts=cfg.num_experts,
                   num_experts_per_tok=cfg.num_experts_per_tok, norm_topk_prob=cfg.norm_topk_prob,
                   output_router_logits=False)
    elif cfg.architecture == "mixtral":
        if cfg.num_experts and not cfg.norm_topk_prob:
            raise ModelConfigError("a mixtral checkpoint renormalises its router weights; use "
                                   "architecture='qwen3_moe' for another layout")
        check_every_layer_sparse(cfg)
        out.update(sliding_window=None, num_local_experts=cfg.num_experts,
                   num_experts_per_tok=cfg.num_experts_per_tok, router_jitter_noise=0.0,
                   output_router_logits=False)
    elif cfg.architecture == "smollm3":  # (no token ids: as for phi3, below)
        out.update(attention_bias=cfg.attention_bias, mlp_bias=False, pad_token_id=None,
                   bos_token_id=None, eos_token_id=None,
                   no_rope_layers=[int(i not in cfg.nope_layers)
                                   for i in range(cfg.num_hidden_layers)])
    elif cfg.architecture in ("deepseek_v3", "deepseek_v2"):
        out.update(deepseek_to_hf(cfg))
    elif cfg.architecture in ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"):
        out.update(qwen3_5_to_hf(cfg))
        rope["partial_rotary_factor"] = cfg.partial_rotary_factor  # (0.25 is the default)
    elif cfg.architecture == KIND:
        out.update(granite_to_hf(cfg))
    elif cfg.architecture == "nemotron_h":
        del out["hidden_act"]  # (its mlp_hidden_act)
        out.update(nemotron_to_hf(cfg))
    elif cfg.architecture == "minimax_m2":
        out.update(minimax_to_hf(cfg))
    elif cfg.architecture == "olmo_hybrid":
        out.update(olmo_hybrid_to_hf(cfg, rope))
    elif cfg.architecture == "lfm2":
        out.update(lfm2_to_hf(cfg))
    elif cfg.architecture == "ernie4_5":  # (its rotary pairs interleaved: hf_layout's turn)
        out.update(use_bias=False, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    elif cfg.architecture == "exaone4":
        # (with a window its full layers are NoPE, without one every layer turns: no other)
        full = {i for i in range(cfg.num_hidden_layers) if not cfg.is_sliding(i)}
        if set(cfg.nope_layers) != (full if cfg.sliding_layers else set()):
            raise ModelConfigError("an exaone4 checkpoint turns no position on its full layers "
                                   "when it has a window, and on every layer when it has none")
        out.update(pad_token_id=None, bos_token_id=None, eos_token_id=None)
    elif cfg.architecture == "glm4_moe":
        out.update(glm4_moe_to_hf(cfg))
        rope["partial_rotary_factor"] = cfg.partial_rotary_factor
    elif cfg.architecture == "glm4":  # (no token ids: as for phi3, below)
        out.update(attention_bias=cfg.attention_bias,
                   partial_rotary_factor=cfg.partial_rotary_factor, pad_token_id=None,
                   bos_token_id=None, eos_token_id=None)
        rope["partial_rotary_factor"] = cfg.partial_rotary_factor  # (1.0 is no default here)
    elif cfg.architecture == "phi3":
        # Phi3Config's default ids (pad and eos 32000) would not fit a smaller vocabulary, and
        # transformers refuses an embedding whose padding row is outside it; a model's own ids
        # travel in its config dict and generation_config.json, not in ModelConfig.
        out.update(sliding_window=None, pad_token_id=None, bos_token_id=None, eos_token_id=None,
                   original_max_position_embeddings=cfg.context_limit,
                   partial_rotary_factor=cfg.partial_rotary_factor)
    else:
        out.update(use_sliding_window=False, sliding_window=None)
    out.update(windows_to_hf(cfg, rope))
    if cfg.architecture in ("qwen3", "qwen3_moe"):
        out.update(attention_bias=cfg.attention_bias)
    if cfg.architecture == "qwen2_moe":
        out.update(qkv_bias=cfg.attention_bias,
                   shared_expert_intermediate_size=cfg.shared_expert_intermediate_size)
    if cfg.architecture in ("qwen3_moe", "qwen2_moe"):
        out.update(
            num_experts=cfg.num_experts,
            num_experts_per_tok=cfg.num_experts_per_tok,
            moe_intermediate_size=cfg.moe_intermediate_size,
            norm_topk_prob=cfg.norm_topk_prob,
            decoder_sparse_step=cfg.decoder_sparse_step,
            mlp_only_layers=list(cfg.mlp_only_layers),
            # No load-balancing loss in training (see model.SparseMoE), and none asked for.
            output_router_logits=False,
        )
    return out
