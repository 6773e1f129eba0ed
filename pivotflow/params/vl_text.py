"""The text model of Qwen's and GLM's vision-language models, said as its plain family's config.

On text, every position a multimodal rope turns by is the same in each of its sections
(time, height, width), so the rope is the plain rope it extends: their text model is Qwen2's
(Qwen2-VL, Qwen2.5-VL), Qwen3's (Qwen3-VL), Qwen3-MoE's (Qwen3-VL-MoE), GLM-4's (GLM-4.1V) or
GLM-4.5's (GLM-4.5V, GLM-4.6V) but for a few defaults and fixed choices its own classes make,
which ``vl_text_config`` writes out (measured: equal logits and greedy tokens to transformers'
wrappers on text, tests/engines/test_vision_language.py). pivotflow holds that text model and
writes its causal LM's folders (``held_config``); the vision tower is left out.
"""

from __future__ import annotations

from typing import Any

# Qwen2VLTextConfig's (and Qwen2_5_VLTextConfig's), Qwen3VLTextConfig's and
# Qwen3VLMoeTextConfig's defaults, where they differ from the plain family's config that
# reads the held text model (Qwen2Config's, Qwen3Config's, Qwen3MoeConfig's)
_QWEN2_VL_TEXT_DEFAULTS = {"vocab_size": 152064, "hidden_size": 8192,
                           "intermediate_size": 29568, "num_hidden_layers": 80,
                           "num_attention_heads": 64, "num_key_value_heads": 8,
                           "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
                           "rope_theta": 1000000.0, "max_window_layers": 80}
_QWEN3_VL_TEXT_DEFAULTS = {"vocab_size": 151936, "hidden_size": 4096,
                           "intermediate_size": 22016, "num_hidden_layers": 32,
                           "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
                           "max_position_embeddings": 128000, "rms_norm_eps": 1e-6,
                           "rope_theta": 500000.0}
_QWEN3_VL_MOE_TEXT_DEFAULTS = {**_QWEN3_VL_TEXT_DEFAULTS, "hidden_size": 2048,
                               "intermediate_size": 5632, "num_hidden_layers": 24,
                               "num_attention_heads": 16, "num_key_value_heads": 16,
                               "num_experts": 60, "num_experts_per_tok": 4,
                               "moe_intermediate_size": 1408, "decoder_sparse_step": 1,
                               "mlp_only_layers": []}
# Glm4vTextConfig's and Glm4vMoeTextConfig's, where they differ from Glm4Config's and
# Glm4MoeConfig's
_GLM4V_TEXT_DEFAULTS = {"vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 13696,
                        "num_hidden_layers": 40, "num_attention_heads": 32,
                        "num_key_value_heads": 2, "max_position_embeddings": 32768,
                        "rms_norm_eps": 1e-5}
_GLM4V_MOE_TEXT_DEFAULTS = {"vocab_size": 151424, "hidden_size": 4096,
                            "intermediate_size": 10944, "num_hidden_layers": 46,
                            "num_attention_heads": 96, "num_key_value_heads": 8,
                            "max_position_embeddings": 65536, "rms_norm_eps": 1e-5,
                            "attention_bias": True, "n_routed_experts": 128,
                            "num_experts_per_tok": 8, "moe_intermediate_size": 1408,
                            "n_shared_experts": 1, "first_k_dense_replace": 1,
                            "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
                            "norm_topk_prob": True}
# the vision-language wrappers: (the text model's family, its causal LM's class, its text
# config class's defaults)
VL_WRAPPERS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen2_vl": ("qwen2", "Qwen2ForCausalLM", _QWEN2_VL_TEXT_DEFAULTS),
    "qwen2_5_vl": ("qwen2", "Qwen2ForCausalLM", _QWEN2_VL_TEXT_DEFAULTS),
    "qwen3_vl": ("qwen3", "Qwen3ForCausalLM", _QWEN3_VL_TEXT_DEFAULTS),
    "qwen3_vl_moe": ("qwen3_moe", "Qwen3MoeForCausalLM", _QWEN3_VL_MOE_TEXT_DEFAULTS),
    "glm4v": ("glm4", "Glm4ForCausalLM", _GLM4V_TEXT_DEFAULTS),
    "glm4v_moe": ("glm4_moe", "Glm4MoeForCausalLM", _GLM4V_MOE_TEXT_DEFAULTS),
    # (GLM-4.6V's: either text model above, as its text_config names it: held_config)
    "glm46v": ("glm4", "Glm4ForCausalLM", _GLM4V_TEXT_DEFAULTS)}
# the keys of a wrapper's own, beside its text model's (Qwen2-VL's and Qwen2.5-VL's Hub
# configs keep the text model's keys at the top, with no text_config)
_OUTER = ("architectures", "model_type", "vision_config", "text_config", "auto_map",
          "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id",
          "vision_token_id")


def flat_text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's keys of a wrapper config that has no ``text_config``."""
    return {k: v for k, v in config.items() if k not in _OUTER}


def vl_text_config(family: str, text: dict[str, Any]) -> dict[str, Any]:
    """``family``'s text config ``text`` as its plain family reads it: its rope without the
    multimodal sections (``mrope_section``: vLLM would otherwise serve multimodal positions,
    which its plain classes have not), its theta and rotating share kept; then each family's
    own fixed choices (``_qwen_vl_text``, ``_glm4v_text``)."""
    out = dict(text)
    for key in ("rope_scaling", "rope_parameters"):
        rope = out.get(key)
        if isinstance(rope, dict):
            rope = {k: v for k, v in rope.items()
                    if k not in ("mrope_section", "mrope_interleaved")
                    and not (k in ("type", "rope_type") and v == "mrope")}
            out[key] = rope or None
    return _glm4v_text(family, out) if family.startswith("glm") else _qwen_vl_text(family, out)


def _glm4v_text(family: str, text: dict[str, Any]) -> dict[str, Any]:
    """GLM-4.1V's text model as GLM-4's: heads as wide as its attention makes them (hidden /
    heads), q/k/v always biased, the whole head rotating where its config names no share
    (GLM-4's default is half); GLM-4.5V's as GLM-4.5's: heads hidden / heads wide where its
    config names none (GLM-4.5's default is 128), no q/k norms, half of each head rotating
    where it names no share."""
    out = dict(text)
    rope_key = "rope_scaling" if out.get("rope_scaling") else "rope_parameters"
    rope = dict(out.get(rope_key) or {})
    heads = out.get("num_attention_heads") or 1
    if family == "glm4v":
        out.update(head_dim=(out.get("hidden_size") or 0) // heads, attention_bias=True)
    else:
        out.update(head_dim=out.get("head_dim") or (out.get("hidden_size") or 0) // heads,
                   use_qk_norm=False)
    partial = rope.get("partial_rotary_factor",
                       out.get("partial_rotary_factor", 1.0 if family == "glm4v" else 0.5))
    rope.setdefault("rope_type", "default")
    out[rope_key] = {**rope, "partial_rotary_factor": partial}
    out["partial_rotary_factor"] = partial
    return out


def _qwen_vl_text(family: str, text: dict[str, Any]) -> dict[str, Any]:
    """A Qwen-VL text config as its plain family's: Qwen2-VL's heads as wide as its attention makes them
    (hidden / heads, whatever ``head_dim`` says); Qwen3-VL-MoE's router renormalising its top
    k (it always does: Qwen3-MoE's does where ``norm_topk_prob``) and its expert count under
    Qwen3-MoE's name."""
    out = dict(text)
    if family in ("qwen2_vl", "qwen2_5_vl"):
        out.pop("head_dim", None)
    if family == "qwen3_vl_moe":
        if "num_local_experts" in out:  # (transformers 5 writes it under Mixtral's name)
            out.setdefault("num_experts", out.pop("num_local_experts"))
        out["norm_topk_prob"] = True
    return out
