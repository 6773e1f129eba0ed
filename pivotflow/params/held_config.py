"""A folder's ``config.json`` as it describes the tensors pivotflow holds (``held_config``),
and the family whose layout differs from pivotflow's (``family_of``; ``hf_layout`` lays those
tensors out).

What changes between the file's config and the held one: a multimodal wrapper's
(``WRAPPERS``) is its text model's own config (its causal LM's), its vision tower left out; a
quantized folder's (block-wise FP8, gpt-oss's MXFP4) is its dequantized bfloat16 model's;
multi-token-prediction layers are counted out; Kimi K2's ``kimi_k2`` is said as
``deepseek_v3``; and the keys vLLM reads that transformers writes none of are added
(DeepSeek-V3's router, MiniMax-M2's, LFM2's widths). The store's folders, vLLM's and
checkpoints say what they hold.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from pivotflow.errors import ModelConfigError
from pivotflow.params.fp8_blocks import is_fp8_blocks
from pivotflow.params.mxfp4 import is_mxfp4
from pivotflow.params.vl_text import VL_WRAPPERS, flat_text_config, vl_text_config

_FAMILIES = {"Phi3ForCausalLM": "phi3", "Phi3ForSequenceClassification": "phi3",
             "MixtralForCausalLM": "mixtral", "MixtralForSequenceClassification": "mixtral",
             "Glm4ForCausalLM": "glm4", "Glm4ForSequenceClassification": "glm4",
             "Glm4MoeForCausalLM": "glm4_moe", "Gemma3ForConditionalGeneration": "gemma3",
             "Gemma4ForConditionalGeneration": "gemma4",
             "Gemma4UnifiedForConditionalGeneration": "gemma4_unified",
             "Llama4ForConditionalGeneration": "llama4",
             "Mistral3ForConditionalGeneration": "mistral3", "GptOssForCausalLM": "gpt_oss",
             "GptOssForSequenceClassification": "gpt_oss",
             "DeepseekV3ForCausalLM": "deepseek_v3",
             "Qwen2VLForConditionalGeneration": "qwen2_vl",
             "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
             "Qwen3VLForConditionalGeneration": "qwen3_vl",
             "Qwen3VLMoeForConditionalGeneration": "qwen3_vl_moe",
             "Glm4vForConditionalGeneration": "glm4v",
             "Glm4vMoeForConditionalGeneration": "glm4v_moe",
             "Glm46VForConditionalGeneration": "glm46v",
             "InternVLForConditionalGeneration": "internvl",
             "LlavaForConditionalGeneration": "llava",
             "LlavaNextForConditionalGeneration": "llava_next",
             "LlavaOnevisionForConditionalGeneration": "llava_onevision"}
# DeepSeek-V3's router as its own configs name it (transformers' DeepseekV3 runs it whatever
# they say; config_from_hf refuses other values)
DEEPSEEK_V3_ROUTER = {"topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_layer_freq": 1}
# the families whose files hold multi-token-prediction layers past the decoder's last, and the
# key that counts them
MTP_FAMILIES = {"glm4_moe": "num_nextn_predict_layers", "deepseek_v3": "num_nextn_predict_layers",
                "glm4_moe_lite": "num_nextn_predict_layers", "minimax_m2": "num_mtp_modules"}
# the families whose files fuse their MLPs and stack their experts as Granite 4.0's
# (``granite_layout``): Granite 3's MoE's too
GRANITE_FILES = ("granitemoehybrid", "granitemoe", "granitemoeshared")
# the families whose files hold them apart, as ``mtp.*`` (Qwen3.5's)
MTP_APART = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")


# Gemma3TextConfig's defaults for the keys the Hub's Gemma 3 4B+ configs leave out of their
# ``text_config`` (written by transformers 4.50: hidden_size, intermediate_size, layers, rope
# scaling and window only); pivotflow's reading of gemma3_text defaults the rest alike
_GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
                         "num_hidden_layers": 26, "num_attention_heads": 8,
                         "num_key_value_heads": 4, "head_dim": 256,
                         "max_position_embeddings": 131072}
# Gemma4UnifiedTextConfig's (gemma-4-12B's) defaults where they differ from Gemma 4's, and
# the keys its class does not have (no per-layer inputs, no experts): its text model is Gemma
# 4's otherwise, and runs, is served and is written as gemma4_text
GEMMA4_UNIFIED_DEFAULTS = {"sliding_window": 1024, "max_position_embeddings": 262144,
                           "hidden_size_per_layer_input": 0, "enable_moe_block": False}
# the multimodal wrappers whose text model pivotflow runs: (its model_type, its causal LM's
# class, defaults for keys the Hub's text_config leaves out); None: the family its
# text_config names (InternVL's and LLaVA's: Qwen2, Qwen3, Qwen3-MoE, Llama, gpt-oss...)
WRAPPERS: dict[str, tuple[str | None, str | None, dict[str, Any]]] = {
    "internvl": (None, None, {}), "llava": (None, None, {}), "llava_next": (None, None, {}),
    "llava_onevision": (None, None, {}),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM", _GEMMA3_TEXT_DEFAULTS),
    "gemma4": ("gemma4_text", "Gemma4ForCausalLM", {}),  # (all Gemma 4s ship so)
    "gemma4_unified": ("gemma4_text", "Gemma4ForCausalLM", GEMMA4_UNIFIED_DEFAULTS),
    "llama4": ("llama4_text", "Llama4ForCausalLM", {}),  # (Scout and Maverick ship so)
    "mistral3": (None, None, {}),  # (Mistral Small 3.1's mistral, Ministral 3's ministral3)
    "qwen3_5": ("qwen3_5_text", "Qwen3_5ForCausalLM", {}),
    "qwen3_5_moe": ("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", {}),
    "kimi_k25": ("deepseek_v3", "DeepseekV3ForCausalLM", {}),
    **VL_WRAPPERS}


def held_config(config: dict[str, Any], where: str = "config.json") -> dict[str, Any]:
    """``config`` as it describes the tensors ``held_layout`` gives: GLM-4.5's,
    DeepSeek-V3's, Qwen3.5's and Qwen3-Next's with no multi-token-prediction layer
    (DeepSeek-V3's naming its router, as vLLM reads it: ``DEEPSEEK_V3_ROUTER``; Kimi K2's
    ``kimi_k2`` said as ``deepseek_v3``), a block-wise FP8 one's unquantized, a
    multimodal wrapper's (``WRAPPERS``) as its text model's own config (its causal LM's), so
    the store's folders, vLLM's and checkpoints say what they hold; every other config as it
    is. Raises ModelConfigError naming ``where`` for a wrapper
    with no ``text_config``."""
    if is_fp8_blocks(config):  # (held dequantized: fp8_blocks)
        config = _unquantized(config)
    family = family_of(config)
    if config.get("model_type") == "gemma4_unified_text":  # (Gemma 4's math: held as it)
        config = {**GEMMA4_UNIFIED_DEFAULTS, **config, "model_type": "gemma4_text",
                  "architectures": ["Gemma4ForCausalLM"]}
    if config.get("model_type") == "kimi_k2":
        # Kimi K2's own name for DeepSeek-V3's architecture (transformers reads it as
        # deepseek_v3, its auto_map's remote code not needed): held, and written, as that
        config = {k: v for k, v in config.items() if k != "auto_map"}
        config.update(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"])
    # (by family: an old export names only its class; else by model_type: Ministral 3's)
    added = _VLLM_KEYS.get(family or "") or _VLLM_KEYS.get(str(config.get("model_type")))
    if added is not None:  # (the keys vLLM reads that transformers writes none of)
        config = _function(added)(config)
    v2 = config.get("model_type") == "deepseek_v2"
    if v2 and (config.get("topk_method") or "greedy") == "greedy":
        # (transformers' greedy choice ignores the groups; vLLM groups by n_group whatever
        # topk_method says)
        config = {**config, "n_group": 1, "topk_group": 1}
    if family in MTP_FAMILIES and config.get(MTP_FAMILIES[family]):
        return {**config, MTP_FAMILIES[family]: 0,
                **({"use_mtp": False} if family == "minimax_m2" else {})}
    if family == "ernie4_5_moe" and config.get("num_nextn_predict_layers"):
        return {**config, "num_nextn_predict_layers": 0}  # (its mtp_* tensors: hf_layout)
    if family in MTP_APART and config.get("mtp_num_hidden_layers"):
        return {**config, "mtp_num_hidden_layers": 0}  # (Qwen3.5's and Qwen3-Next's)
    if family == "gpt_oss" and is_mxfp4(config):  # (held dequantized: mxfp4)
        return _unquantized(config)
    if family not in WRAPPERS:
        return config
    text = config.get("text_config")
    if text is None and family in VL_WRAPPERS:  # (Qwen2.5-VL's Hub configs: flat)
        text = flat_text_config(config)
    if not isinstance(text, dict):
        raise ModelConfigError(f"{where}: a {family} config needs its text model's config as "
                               f"an object 'text_config', got {type(text).__name__}")
    if family == "glm46v":  # (GLM-4.6V-Flash's GLM-4.1V text model, GLM-4.6V's GLM-4.5V one)
        family = "glm4v_moe" if text.get("model_type") == "glm4v_moe_text" else "glm4v"
    kind, causal_lm, defaults = WRAPPERS[family]
    if kind is None:  # (the text model's own family: its class, if pivotflow runs it)
        kind, causal_lm = _named_text_model(family, text, where)
    # The wrapper's dtype and tying, where it says them, are the text model's: transformers 5
    # writes and ties by the wrapper's key; the Hub's configs (transformers 4.50) leave it out
    # unless it differs from the default, and the text config's then decides, as it did there.
    # A quantization the wrapper names is its text model's too (refused by config_from_hf
    # unless pivotflow dequantizes it: Kimi K2.5's INT4 is not).
    keys: tuple[str, ...] = ("dtype", "torch_dtype", "tie_word_embeddings", "quantization_config")
    outer = {k: config[k] for k in keys if k in config}
    if family in VL_WRAPPERS:
        # (their wrapper's tying alone decides, false where it says nothing, in
        # transformers 5 as in 4.57: Qwen3-VL-MoE's text config's own default is true)
        outer["tie_word_embeddings"] = config.get("tie_word_embeddings", False)
        text = vl_text_config(family, text)
    # (the text model's own family's reading next: Kimi K2.5's is DeepSeek-V3's router)
    return held_config({**defaults, **text, **outer, "model_type": kind,
                        "architectures": [causal_lm]}, where)


def _named_text_model(family: str, text: dict[str, Any], where: str) -> tuple[str, str]:
    """(model_type, causal LM class) of the family a wrapper's ``text`` config names. Raises
    ModelConfigError naming ``where`` for one the embedded engine does not run."""
    from pivotflow.engines.torch.hf_config_write import HF_CLASSES

    kind = text.get("model_type") or ("mistral" if family == "mistral3" else None)
    if kind not in HF_CLASSES:
        raise ModelConfigError(f"{where} text_config: model_type={kind!r} is not supported by "
                               f"the embedded engine as {family}'s text model "
                               f"({', '.join(HF_CLASSES)})")
    return str(kind), HF_CLASSES[kind]


def _minimax_router(config: dict[str, Any]) -> dict[str, Any]:
    """A MiniMax-M2 config without its remote code (``auto_map``: transformers 5 and vLLM run
    it natively), with the keys vLLM's module reads that transformers writes none of: its
    router (a sigmoid with a correction bias) and ``rotary_dim``."""
    out = {k: v for k, v in config.items() if k != "auto_map"}
    out.update(scoring_func="sigmoid", use_routing_bias=True)
    if "rotary_dim" not in out:
        rope = out.get("rope_parameters") or out.get("rope_scaling") or {}
        partial = rope.get("partial_rotary_factor", out.get("partial_rotary_factor", 1.0))
        out["rotary_dim"] = int(out.get("head_dim", 128) * partial)
    return out


def _deepseek_v3_router(config: dict[str, Any]) -> dict[str, Any]:
    """The router transformers runs, said as DeepSeek's own configs say it: vLLM reads these
    keys (without them, a softmax router with no correction bias)."""
    return {**config, **DEEPSEEK_V3_ROUTER}


def _lfm2_widths(config: dict[str, Any]) -> dict[str, Any]:
    """LFM2's widths as the Hub's configs say them, which vLLM reads."""
    return {"conv_dim": config.get("hidden_size"), "block_dim": config.get("hidden_size"),
            **config}


# The keys vLLM reads that transformers writes none of, added to a config by its model_type:
# a function of this module's, or "module.function" of pivotflow.engines.torch's family
# modules (imported when used: they import this module).
_VLLM_KEYS: dict[str, Callable[[dict[str, Any]], dict[str, Any]] | str] = {
    "deepseek_v3": _deepseek_v3_router,
    "minimax_m2": _minimax_router,  # (transformers 5 and vLLM run it natively: no remote code)
    "lfm2": _lfm2_widths, "lfm2_moe": _lfm2_widths,
    "glm4_moe_lite": "hf_glm_lite.glm_lite_vllm_keys",  # (its dense layers' count)
    "ministral3": "hf_ministral.ministral_vllm_keys",  # (its query scaling, by its own key)
    "hy_v3": "hf_hy_v3.hy_v3_vllm_keys",  # (the released configs' keys)
    "afmoe": "hf_afmoe.afmoe_vllm_keys",  # (the released configs' router keys)
    "gemma4_text": "hf_gemma4.gemma4_vllm_keys",  # (experts by num_experts alone there)
}


def _function(added: Callable[[dict[str, Any]], dict[str, Any]] | str
              ) -> Callable[[dict[str, Any]], dict[str, Any]]:
    if callable(added):
        return added
    module, name = added.split(".")
    return getattr(importlib.import_module(f"pivotflow.engines.torch.{module}"), name)  # type: ignore[no-any-return]


def _unquantized(config: dict[str, Any]) -> dict[str, Any]:
    """A quantized folder's config as pivotflow holds its weights: dequantized, in bfloat16
    (which holds every FP8 and MXFP4 value exactly), with no quantization_config."""
    return {k: v for k, v in {**config, "dtype": "bfloat16", "torch_dtype": "bfloat16"}.items()
            if k != "quantization_config"}


def config_where(config: dict[str, Any], where: str) -> str:
    """Where ``held_config(config)``'s keys are, for an error: a wrapper's ``text_config``."""
    return f"{where} text_config" if family_of(config) in WRAPPERS else where


def family_of(config: dict[str, Any]) -> str | None:
    """The family whose on-disk layout differs from pivotflow's (phi3, mixtral, glm4,
    glm4_moe, deepseek_v3, gpt_oss, qwen3_5_text, qwen3_5_moe_text, qwen3_next, mistral4,
    afmoe, apertus, hy_v3..., and the multimodal wrappers: ``WRAPPERS``), or None."""
    kind = config.get("model_type")
    if kind == "kimi_k2":  # (DeepSeek-V3's architecture under Kimi's name: held_config)
        return "deepseek_v3"
    if kind is None:  # very old exports name only the class
        kind = next((_FAMILIES[a] for a in config.get("architectures") or [] if a in _FAMILIES),
                    None)
    if kind == "gemma4_text":  # (its experts beside the MLP: gemma4_layout)
        return kind if config.get("enable_moe_block") else None
    return kind if kind in ("phi3", "mixtral", "glm4", "gpt_oss", *GRANITE_FILES,
                            "nemotron_h", "olmo_hybrid", "ernie4_5", "ernie4_5_moe", "lfm2",
                            "lfm2_moe", "hunyuan_v1_dense", "hunyuan_v1_moe", "mistral4",
                            "afmoe", "apertus", "hy_v3", "cohere2", "cohere", "llama4_text",
                            *MTP_FAMILIES,
                            *MTP_APART,
                            *WRAPPERS) else None
