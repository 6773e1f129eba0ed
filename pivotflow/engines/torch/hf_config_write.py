"""ModelConfig -> the Hugging Face ``config.json`` transformers rebuilds it from
(``config_to_hf``), and the classes each family's config names (``HF_CLASSES``, and
``HF_CLASSIFIERS`` for reward models). Each family writes the keys its own config class reads;
the per-family writers with more than a few keys live beside their readers (``hf_families``,
``hf_granite``, ``hf_nemotron``...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pivotflow.engines.torch.hf_afmoe import afmoe_to_hf
from pivotflow.engines.torch.hf_cohere2 import cohere2_to_hf
from pivotflow.engines.torch.hf_dots import dots_to_hf
from pivotflow.engines.torch.hf_ernie import ernie_moe_to_hf
from pivotflow.engines.torch.hf_families import (
    GRANITE_KEYS,
    check_every_layer_sparse,
    deepseek_to_hf,
    glm4_moe_to_hf,
    granite_moe_to_hf,
    qwen3_5_to_hf,
)
from pivotflow.engines.torch.hf_gemma4 import gemma4_to_hf
from pivotflow.engines.torch.hf_glm_lite import glm_lite_to_hf
from pivotflow.engines.torch.hf_granite import KIND, granite_to_hf
from pivotflow.engines.torch.hf_granite_swa import granite_swa_to_hf
from pivotflow.engines.torch.hf_hunyuan import hunyuan_moe_to_hf
from pivotflow.engines.torch.hf_hy_v3 import hy_v3_to_hf
from pivotflow.engines.torch.hf_lfm2 import lfm2_to_hf
from pivotflow.engines.torch.hf_llama4 import llama4_to_hf
from pivotflow.engines.torch.hf_minicpm5 import minicpm5_to_hf
from pivotflow.engines.torch.hf_minimax import minimax_to_hf
from pivotflow.engines.torch.hf_ministral import ministral_to_hf
from pivotflow.engines.torch.hf_mistral4 import mistral4_to_hf
from pivotflow.engines.torch.hf_nemotron import nemotron_to_hf
from pivotflow.engines.torch.hf_olmo_hybrid import olmo_hybrid_to_hf
from pivotflow.engines.torch.hf_rope import rope_to_hf
from pivotflow.engines.torch.hf_solar_open import solar_open_to_hf
from pivotflow.engines.torch.hf_windows import windows_to_hf
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.errors import ModelConfigError

# the config keys every family writes (and reads as required: hf_config)
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "max_position_embeddings")  # fmt: skip
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
              "lfm2": "Lfm2ForCausalLM",
              "seed_oss": "SeedOssForCausalLM",
              "hunyuan_v1_dense": "HunYuanDenseV1ForCausalLM",
              "hunyuan_v1_moe": "HunYuanMoEV1ForCausalLM",
              "ernie4_5_moe": "Ernie4_5_MoeForCausalLM",
              "ministral3": "Ministral3ForCausalLM", "mistral4": "Mistral4ForCausalLM",
              "solar_open": "SolarOpenForCausalLM", "arcee": "ArceeForCausalLM",
              "afmoe": "AfmoeForCausalLM", "apertus": "ApertusForCausalLM",
              "hy_v3": "HYV3ForCausalLM", "granite_swa": "GraniteSWAForCausalLM",
              "minicpm5_moe": "MiniCPM5MoeForCausalLM",
              "glm4_moe_lite": "Glm4MoeLiteForCausalLM",
              "lfm2_moe": "Lfm2MoeForCausalLM",
              "dots1": "Dots1ForCausalLM", "gemma4_text": "Gemma4ForCausalLM",
              "granitemoe": "GraniteMoeForCausalLM",
              "granitemoeshared": "GraniteMoeSharedForCausalLM",
              "cohere2": "Cohere2ForCausalLM", "cohere": "CohereForCausalLM",
              "llama4_text": "Llama4ForCausalLM"}  # fmt: skip
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
                  "exaone4": "Exaone4ForSequenceClassification",
                  "seed_oss": "SeedOssForSequenceClassification",
                  "hunyuan_v1_dense": "HunYuanDenseV1ForSequenceClassification",
                  "hunyuan_v1_moe": "HunYuanMoEV1ForSequenceClassification",
                  "ministral3": "Ministral3ForSequenceClassification",
                  "mistral4": "Mistral4ForSequenceClassification",
                  "arcee": "ArceeForSequenceClassification"}
# (transformers has no sequence classifier for glm4_moe, olmoe, granite, granitemoehybrid,
# qwen3_5_moe_text, apertus, afmoe, hy_v3, solar_open or granite_swa: no critic from them)


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
    rope = rope_to_hf(cfg)
    classes = HF_CLASSIFIERS if cfg.num_labels else HF_CLASSES
    out: dict[str, Any] = {
        "architectures": [classes[cfg.architecture]],
        "model_type": cfg.architecture,
        **{
            f: getattr(cfg, f)
            for f in (
                *REQUIRED,
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
    out.update(_OWN_KEYS.get(cfg.architecture, _qwen_keys)(cfg, rope))
    out.update(windows_to_hf(cfg, rope))
    return {k: v for k, v in out.items() if v is not _DROP}


# Each family's own keys for ``cfg`` (a writer may add keys to ``rope``, the written
# ``rope_parameters``). Token ids are left out where a family's defaults would not fit a
# smaller vocabulary (transformers refuses an embedding whose padding row is outside it); a
# model's own ids travel in its config dict and generation_config.json, not in ModelConfig.
_Writer = Callable[[ModelConfig, dict[str, Any]], dict[str, Any]]
_NO_IDS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
_DROP = object()  # (a key the family's config does not have: Gemma's and Nemotron-H's hidden_act)


def _llama_keys(cfg: ModelConfig, rope: dict[str, Any]) -> dict[str, Any]:
    """Llama's, OLMo-2's, OLMo-3's, Granite's and Granite SWA's (its multipliers, its bases
    per layer)."""
    out: dict[str, Any] = {"attention_bias": cfg.attention_bias, "mlp_bias": False}
    if cfg.architecture in ("granite", "granite_swa"):
        out.update({key: getattr(cfg, key) for key in GRANITE_KEYS},
                   attention_multiplier=cfg.attention_scale)
    if cfg.architecture == "granite_swa":
        out.update(granite_swa_to_hf(cfg), **_NO_IDS)
    return out


def _gemma_keys(cfg: ModelConfig, rope: dict[str, Any]) -> dict[str, Any]:
    """Gemma 2's and 3's: their gate's name, query scalar and soft-capping (``hidden_act`` is
    not theirs)."""
    return {"attention_bias": cfg.attention_bias, "hidden_activation": cfg.hidden_act,
            "hidden_act": _DROP,
            "query_pre_attn_scalar": (int(cfg.query_pre_attn_scalar)  # (an int there)
                                      if cfg.query_pre_attn_scalar.is_integer()
                                      else cfg.query_pre_attn_scalar),
            "final_logit_softcapping": cfg.final_logit_softcapping or None,
            "attn_logit_softcapping": cfg.attn_logit_softcapping or None,
            "use_bidirectional_attention": False}


def _gpt_oss_keys(cfg: ModelConfig, rope: dict[str, Any]) -> dict[str, Any]:
    check_every_layer_sparse(cfg)
    return {"attention_bias": cfg.attention_bias, "num_local_experts": cfg.num_experts,
            "num_experts_per_tok": cfg.num_experts_per_tok, "swiglu_alpha": cfg.swiglu_alpha,
            "swiglu_limit": cfg.swiglu_limit, "output_router_logits": False, **_NO_IDS}


def _olmoe_keys(cfg: ModelConfig, rope: dict[str, Any]) -> dict[str, Any]:
    check_every_layer_sparse(cfg)
    return {"attention_bias": cfg.attention_bias, "clip_qkv": None,
            "num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
            "norm_topk_prob": cfg.norm_topk_prob, "output_router_logits": False}


def _mixtral_keys(cfg: ModelConfig, rope: dict[str, Any]) -> dict[str, Any]:
    if cfg.num_experts and not cfg.norm_topk_prob:
        raise ModelConfigError("a mixtral checkpoint renormalises its router weights; use "
                               "architecture='qwen3_moe' for another layout")
    check_every_layer_sparse(cfg)
    return {"sliding_window": None, "num_local_experts": cfg.num_experts,
            "num_experts_per_tok": cfg.num_experts_per_tok, "router_jitter_noise": 0.0,
            "output_router_logits": False}


def _smollm3_keys(cfg: ModelConfig, rope: dict[str, Any]) -> dict[str, Any]:
    return {"attention_bias": cfg.attention_bias, "mlp_bias": False, **_NO_IDS,
            "no_rope_layers": [int(i not in cfg.nope_layers)
                               for i in range(cfg.num_hidden_layers)]}


def _exaone4_keys(cfg: ModelConfig, rope: dict[str, Any]) -> dict[str, Any]:
    """EXAONE 4.0's: with a window its full layers are NoPE, without one every layer turns (no
    other pattern)."""
    full = {i for i in range(cfg.num_hidden_layers) if not cfg.is_sliding(i)}
    if set(cfg.nope_layers) != (full if cfg.sliding_layers else set()):
        raise ModelConfigError("an exaone4 checkpoint turns no position on its full layers "
                               "when it has a window, and on every layer when it has none")
    return dict(_NO_IDS)


def _glm4_keys(cfg: ModelConfig, rope: dict[str, Any]) -> dict[str, Any]:
    rope["partial_rotary_factor"] = cfg.partial_rotary_factor  # (1.0 is no default here)
    return {"attention_bias": cfg.attention_bias,
            "partial_rotary_factor": cfg.partial_rotary_factor, **_NO_IDS}


def _glm4_moe_keys(cfg: ModelConfig, rope: dict[str, Any]) -> dict[str, Any]:
    rope["partial_rotary_factor"] = cfg.partial_rotary_factor
    return glm4_moe_to_hf(cfg)


def _qwen3_5_keys(cfg: ModelConfig, rope: dict[str, Any]) -> dict[str, Any]:
    rope["partial_rotary_factor"] = cfg.partial_rotary_factor  # (0.25 is the default)
    return qwen3_5_to_hf(cfg)


def _phi3_keys(cfg: ModelConfig, rope: dict[str, Any]) -> dict[str, Any]:
    return {"sliding_window": None, **_NO_IDS,
            "original_max_position_embeddings": cfg.context_limit,
            "partial_rotary_factor": cfg.partial_rotary_factor}


def _qwen_keys(cfg: ModelConfig, rope: dict[str, Any]) -> dict[str, Any]:
    """Qwen2's, Qwen3's, Qwen3-MoE's and Qwen2-MoE's: no window unless ``windows_to_hf``
    says one, their biases' keys, their experts'."""
    out: dict[str, Any] = {"use_sliding_window": False, "sliding_window": None}
    if cfg.architecture in ("qwen3", "qwen3_moe"):
        out.update(attention_bias=cfg.attention_bias)
    if cfg.architecture == "qwen2_moe":
        out.update(qkv_bias=cfg.attention_bias,
                   shared_expert_intermediate_size=cfg.shared_expert_intermediate_size)
    if cfg.architecture in ("qwen3_moe", "qwen2_moe"):
        out.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
                   moe_intermediate_size=cfg.moe_intermediate_size,
                   norm_topk_prob=cfg.norm_topk_prob, decoder_sparse_step=cfg.decoder_sparse_step,
                   mlp_only_layers=list(cfg.mlp_only_layers),
                   # No load-balancing loss in training (see model.SparseMoE), none asked for.
                   output_router_logits=False)
    return out


def _keys(writer: Callable[[ModelConfig], dict[str, Any]]) -> _Writer:
    """A writer of ``cfg`` alone (its rope untouched)."""
    return lambda cfg, _rope: writer(cfg)


_OWN_KEYS: dict[str, _Writer] = {
    **dict.fromkeys(("llama", "olmo2", "olmo3", "granite", "granite_swa"), _llama_keys),
    **dict.fromkeys(("gemma3_text", "gemma2"), _gemma_keys),
    "ministral3": ministral_to_hf, "mistral4": mistral4_to_hf,
    "mistral": lambda cfg, _: {"sliding_window": None},  # (explicitly: its default is 4096)
    "gpt_oss": _gpt_oss_keys, "olmoe": _olmoe_keys, "mixtral": _mixtral_keys,
    "smollm3": _smollm3_keys, "exaone4": _exaone4_keys, "glm4": _glm4_keys,
    "glm4_moe": _glm4_moe_keys, "phi3": _phi3_keys,
    **dict.fromkeys(("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"), _qwen3_5_keys),
    "olmo_hybrid": olmo_hybrid_to_hf,
    "gemma4_text": lambda cfg, _: gemma4_to_hf(cfg, _DROP),
    **dict.fromkeys(("granitemoe", "granitemoeshared"), _keys(granite_moe_to_hf)),
    **dict.fromkeys(("cohere2", "cohere"), lambda cfg, _: cohere2_to_hf(cfg, _DROP)),
    "hy_v3": _keys(hy_v3_to_hf), "afmoe": _keys(afmoe_to_hf), "llama4_text": _keys(llama4_to_hf),
    "solar_open": _keys(solar_open_to_hf), "dots1": _keys(dots_to_hf),
    "minicpm5_moe": _keys(minicpm5_to_hf),
    "glm4_moe_lite": _keys(glm_lite_to_hf),
    **dict.fromkeys(("deepseek_v3", "deepseek_v2"), _keys(deepseek_to_hf)),
    KIND: _keys(granite_to_hf), "minimax_m2": _keys(minimax_to_hf),
    "nemotron_h": lambda cfg, _: {**nemotron_to_hf(cfg), "hidden_act": _DROP},  # (its own key)
    **dict.fromkeys(("lfm2", "lfm2_moe"), _keys(lfm2_to_hf)),
    # (no token ids: theirs are a big vocabulary's)
    **dict.fromkeys(("arcee", "apertus"), lambda cfg, _: {
        "attention_bias": cfg.attention_bias, "mlp_bias": False, **_NO_IDS}),
    "seed_oss": lambda cfg, _: {"attention_bias": cfg.attention_bias,
                                "attention_out_bias": False, "mlp_bias": False, **_NO_IDS},
    # (rope: hf_hunyuan)
    **dict.fromkeys(("hunyuan_v1_dense", "hunyuan_v1_moe"), lambda cfg, _: {
        "attention_bias": cfg.attention_bias, "mlp_bias": False, "use_cla": False, **_NO_IDS,
        "eod_token_id": None, "sep_token_id": None, **hunyuan_moe_to_hf(cfg)}),
    # (rotary pairs: hf_layout's turn)
    **dict.fromkeys(("ernie4_5", "ernie4_5_moe"), lambda cfg, _: {
        **_NO_IDS, **ernie_moe_to_hf(cfg)}),
}
