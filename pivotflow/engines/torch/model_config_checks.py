"""``ModelConfig.validate``'s checks: each raises ModelConfigError naming the first field
that does not fit the others (a count that must be positive, layers outside the model, a
family's own fields on another family), so a bad ``config.json`` fails in one line before a
tensor is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pivotflow.engines.torch.architectures import (
    ACTIVATIONS,
    ARCHITECTURES,
    BLOCK_ARCHITECTURES,
    HYBRID_ARCHITECTURES,
    LATENT_ARCHITECTURES,
    MAMBA_ARCHITECTURES,
    MOE_ARCHITECTURES,
    NOPE_ARCHITECTURES,
    OPTIONAL_QK_NORM_ARCHITECTURES,
    QK_NORM_ARCHITECTURES,
    RESIDUAL_SCALED_MOE,
    ROPE_TYPES,
    SCORING_FUNCS,
)
from pivotflow.errors import ModelConfigError

if TYPE_CHECKING:
    from pivotflow.engines.torch.model_config import ModelConfig


def check(cfg: ModelConfig) -> None:
    """Raise ModelConfigError naming ``cfg``'s first inconsistent field."""
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim",
                 "max_position_embeddings"):  # fmt: skip
        if getattr(cfg, name) <= 0:
            raise ModelConfigError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.num_labels < 0:
        raise ModelConfigError(f"num_labels must be >= 0, got {cfg.num_labels}")
    if cfg.architecture not in ARCHITECTURES:
        raise ModelConfigError(
            f"architecture {cfg.architecture!r} is not one of {', '.join(ARCHITECTURES)}"
        )
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ModelConfigError(
            f"num_attention_heads {cfg.num_attention_heads} is not a multiple of "
            f"num_key_value_heads {cfg.num_key_value_heads}"
        )
    if cfg.llama4_scaling_beta and cfg.architecture not in ("ministral3", "mistral4"):
        raise ModelConfigError(f"llama4_scaling_beta does not fit architecture "
                               f"{cfg.architecture!r} (Ministral 3's and Mistral 4's query "
                               "scaling)")
    _latent(cfg)  # (before head_dim's checks: its parts name what is wrong)
    _global_layers(cfg)
    if cfg.head_dim % 2:
        raise ModelConfigError(f"head_dim {cfg.head_dim} must be even for rotary embeddings")
    if cfg.rotary_dim % 2 or not 0 < cfg.partial_rotary_factor <= 1:
        raise ModelConfigError(
            f"partial_rotary_factor {cfg.partial_rotary_factor} must rotate an even number "
            f"of head_dim {cfg.head_dim}'s dimensions (got {cfg.rotary_dim})")
    factors = {len(cfg.rope_short_factor), len(cfg.rope_long_factor)}
    if cfg.rope_type == "longrope" and factors != {cfg.rotary_dim // 2}:
        raise ModelConfigError(
            f"longrope needs {cfg.rotary_dim // 2} short and long factors (one per rotary "
            f"frequency), got {len(cfg.rope_short_factor)} and {len(cfg.rope_long_factor)}")
    if (cfg.qk_norm != (cfg.architecture in QK_NORM_ARCHITECTURES)
            and cfg.architecture not in OPTIONAL_QK_NORM_ARCHITECTURES):
        raise ModelConfigError(
            f"qk_norm={cfg.qk_norm} does not fit architecture {cfg.architecture!r} "
            f"(only {', '.join(QK_NORM_ARCHITECTURES)} normalise q and k)"
        )
    _experts(cfg)
    _windows(cfg)
    _linear(cfg)
    if cfg.hidden_act not in ACTIVATIONS:
        raise ModelConfigError(
            f"hidden_act {cfg.hidden_act!r} is not one of {', '.join(ACTIVATIONS)}")
    for name in ("embedding_multiplier", "residual_multiplier", "logits_scaling"):
        if not getattr(cfg, name) > 0:
            raise ModelConfigError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.residual_multiplier != 1.0 and (cfg.post_norm or cfg.sandwich_norm or (
            cfg.num_experts and cfg.architecture not in RESIDUAL_SCALED_MOE)):
        raise ModelConfigError("residual_multiplier scales a dense pre-norm layer's "
                               f"sub-layers only (Granite's), not {cfg.architecture!r}'s")
    for name in ("attn_logit_softcapping", "final_logit_softcapping", "attention_multiplier"):
        if getattr(cfg, name) < 0:
            raise ModelConfigError(f"{name} must be >= 0 (0: none), got {getattr(cfg, name)}")
    if cfg.query_pre_attn_scalar < 0:
        raise ModelConfigError(
            f"query_pre_attn_scalar must be >= 0, got {cfg.query_pre_attn_scalar}")
    if cfg.rope_type not in ROPE_TYPES:
        raise ModelConfigError(
            f"rope_type {cfg.rope_type!r} is not one of {', '.join(ROPE_TYPES)}"
        )
    if cfg.rope_type != "default" and not cfg.rope_factor > 0:
        raise ModelConfigError(f"rope_factor must be positive, got {cfg.rope_factor}")
    if (
        cfg.rope_type == "llama3"
        and not cfg.rope_high_freq_factor >= cfg.rope_low_freq_factor
    ):  # (equal: no band blended, Llama 4 Scout's)
        raise ModelConfigError(
            f"rope_high_freq_factor {cfg.rope_high_freq_factor} must be at least "
            f"rope_low_freq_factor {cfg.rope_low_freq_factor}"
        )
    if cfg.rope_type == "yarn" and not cfg.rope_beta_fast > cfg.rope_beta_slow > 0:
        raise ModelConfigError(
            f"rope_beta_fast {cfg.rope_beta_fast} must exceed rope_beta_slow "
            f"{cfg.rope_beta_slow}, and both be positive"
        )
    if cfg.rope_attention_factor < 0:
        raise ModelConfigError(
            f"rope_attention_factor must be >= 0, got {cfg.rope_attention_factor}"
        )


def _global_layers(cfg: ModelConfig) -> None:
    """Gemma 4's full layers' own heads, values and rope fit Gemma 4 alone, and its heads."""
    gemma4 = cfg.architecture == "gemma4_text"
    for name in ("global_head_dim", "num_global_key_value_heads", "attention_k_eq_v"):
        value = getattr(cfg, name)
        if value and not gemma4:
            raise ModelConfigError(f"{name}={value!r} does not fit architecture "
                                   f"{cfg.architecture!r} (Gemma 4's full layers)")
    if cfg.rope_type == "proportional" and not gemma4:
        raise ModelConfigError(f"rope_type 'proportional' does not fit architecture "
                               f"{cfg.architecture!r} (Gemma 4's full layers)")
    if cfg.global_head_dim < 0 or cfg.global_head_dim % 2:
        raise ModelConfigError(f"global_head_dim must be even and >= 0 (0: head_dim), got "
                               f"{cfg.global_head_dim}")
    for name in ("hidden_size_per_layer_input", "vocab_size_per_layer_input",
                 "num_kv_shared_layers", "use_double_wide_mlp"):
        value = getattr(cfg, name)
        if value and not gemma4:
            raise ModelConfigError(f"{name}={value!r} does not fit architecture "
                                   f"{cfg.architecture!r} (Gemma 4's)")
    if cfg.hidden_size_per_layer_input < 0 or (
            cfg.hidden_size_per_layer_input
            and cfg.vocab_size_per_layer_input < cfg.vocab_size):
        raise ModelConfigError(
            f"hidden_size_per_layer_input must be >= 0 (0: none), and with per-layer inputs "
            f"vocab_size_per_layer_input ({cfg.vocab_size_per_layer_input}) cover vocab_size "
            f"({cfg.vocab_size})")
    shared = cfg.num_kv_shared_layers
    first = cfg.num_hidden_layers - shared
    kinds = {cfg.is_sliding(i) for i in range(first)}
    if not 0 <= shared < cfg.num_hidden_layers or any(
            cfg.is_sliding(i) not in kinds for i in range(first, cfg.num_hidden_layers)):
        raise ModelConfigError(f"num_kv_shared_layers {shared} must leave, before them, a layer "
                               f"of each type they have (of {cfg.num_hidden_layers} layers)")
    kv = cfg.num_global_key_value_heads
    if kv < 0 or (kv and cfg.num_attention_heads % kv):
        raise ModelConfigError(f"num_attention_heads {cfg.num_attention_heads} is not a "
                               f"multiple of num_global_key_value_heads {kv}")


def _inside(cfg: ModelConfig, field: str) -> None:
    """Raise naming ``field`` (a tuple of layer numbers) where one is not a layer of ``cfg``."""
    outside = [i for i in getattr(cfg, field) if not 0 <= i < cfg.num_hidden_layers]
    if outside:
        raise ModelConfigError(f"{field} {outside} are not layers of a "
                               f"{cfg.num_hidden_layers}-layer model")


def _windows(cfg: ModelConfig) -> None:
    if cfg.sliding_layers and cfg.sliding_window <= 0:
        raise ModelConfigError(f"sliding_layers {list(cfg.sliding_layers)} need a "
                               f"sliding_window > 0, got {cfg.sliding_window}")
    _inside(cfg, "sliding_layers")
    _inside(cfg, "nope_layers")
    if cfg.nope_layers and cfg.architecture not in NOPE_ARCHITECTURES:
        raise ModelConfigError(f"nope_layers do not fit architecture {cfg.architecture!r} "
                               f"(only {', '.join(NOPE_ARCHITECTURES)} has NoPE layers)")
    if cfg.sliding_rope_theta < 0:
        raise ModelConfigError(
            f"sliding_rope_theta must be >= 0, got {cfg.sliding_rope_theta}")
    _llama4(cfg)


def _llama4(cfg: ModelConfig) -> None:
    """Llama 4's chunks, query temperature and weightless q/k norms fit it alone."""
    llama4 = cfg.architecture == "llama4_text"
    for name in ("attention_chunk_size", "attn_scale", "weightless_qk_norm"):
        if getattr(cfg, name) and not llama4:
            raise ModelConfigError(f"{name} does not fit architecture {cfg.architecture!r} "
                                   "(Llama 4's)")
    if cfg.attention_chunk_size < 0 or cfg.attn_scale < 0 or not cfg.floor_scale > 0:
        raise ModelConfigError("attention_chunk_size and attn_scale must be >= 0 and "
                               f"floor_scale > 0, got {cfg.attention_chunk_size}, "
                               f"{cfg.attn_scale}, {cfg.floor_scale}")
    if cfg.attention_chunk_size and cfg.sliding_window != cfg.attention_chunk_size:
        raise ModelConfigError(f"attention_chunk_size {cfg.attention_chunk_size} needs "
                               f"sliding_window {cfg.attention_chunk_size} (its chunked "
                               f"layers see no further back), got {cfg.sliding_window}")

def _linear(cfg: ModelConfig) -> None:
    dims = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
            "linear_value_head_dim", "linear_conv_kernel_dim")
    _mamba(cfg)
    if cfg.conv_bias and not cfg.short_conv:
        raise ModelConfigError(f"conv_bias does not fit architecture {cfg.architecture!r} (only "
                               "lfm2's short convolutions)")
    if cfg.short_conv:  # (a convolution's taps alone)
        if _has_linear_layers(cfg, ("linear_conv_kernel_dim",)) and cfg.sliding_layers:
            raise ModelConfigError("sliding windows do not fit a hybrid 'lfm2' model")
        return
    if cfg.architecture not in HYBRID_ARCHITECTURES:
        if any(getattr(cfg, name) for name in dims) or (
                cfg.linear_attention_layers and not cfg.mamba):
            raise ModelConfigError(
                f"linear attention (linear_attention_layers, {', '.join(dims)}) does not "
                f"fit architecture {cfg.architecture!r} (only "
                f"{', '.join(HYBRID_ARCHITECTURES + MAMBA_ARCHITECTURES)} has it)")
        return
    if not _has_linear_layers(cfg, dims):
        return
    if cfg.linear_num_value_heads % cfg.linear_num_key_heads:
        raise ModelConfigError(
            f"linear_num_value_heads {cfg.linear_num_value_heads} is not a multiple of "
            f"linear_num_key_heads {cfg.linear_num_key_heads}")
    if cfg.sliding_layers:
        raise ModelConfigError("sliding windows do not fit a hybrid "
                               f"{cfg.architecture!r} model")

def _has_linear_layers(cfg: ModelConfig, dims: tuple[str, ...]) -> bool:
    """Whether ``cfg`` has linear layers (each inside the model, its widths ``dims`` each
    positive: raises naming the first that is not)."""
    _inside(cfg, "linear_attention_layers")
    if not cfg.linear_attention_layers:
        return False
    for name in dims:
        if getattr(cfg, name) <= 0:
            raise ModelConfigError(f"{name} must be positive, got {getattr(cfg, name)}")
    return True


_MAMBA_DIMS = ("mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state",
               "mamba_d_conv", "mamba_expand")


def _blocks(cfg: ModelConfig) -> None:
    """Nemotron-H's one-block layers: MLP blocks inside the model, none a linear layer; its
    MLPs ungated (relu2), as Arcee's, every other family's gated."""
    nemotron = cfg.architecture in BLOCK_ARCHITECTURES
    if cfg.mlp_blocks and not nemotron:
        raise ModelConfigError(f"mlp_blocks do not fit architecture {cfg.architecture!r} (only "
                               f"{', '.join(BLOCK_ARCHITECTURES)} has one-block layers)")
    _inside(cfg, "mlp_blocks")
    both = sorted(set(cfg.mlp_blocks) & set(cfg.linear_attention_layers))
    if both:
        raise ModelConfigError(f"layers {both} are both MLP blocks and Mamba2 layers")
    if (cfg.architecture == "apertus") != (cfg.hidden_act == "xielu"):
        raise ModelConfigError(f"hidden_act {cfg.hidden_act!r} does not fit architecture "
                               f"{cfg.architecture!r} (xielu is Apertus's, and only its)")
    if (nemotron or cfg.architecture == "arcee") != (cfg.hidden_act == "relu2"):
        raise ModelConfigError(f"hidden_act {cfg.hidden_act!r} does not fit architecture "
                               f"{cfg.architecture!r} (relu2 is Nemotron-H's and Arcee's, and "
                               "only theirs)")


def _mamba(cfg: ModelConfig) -> None:
    """Granite 4.0-H's and Nemotron-H's Mamba2 layers' widths (and Granite's shared MLP's,
    Granite 4.0's and granitemoeshared's alone)."""
    _blocks(cfg)
    if cfg.shared_intermediate_size < 0:
        raise ModelConfigError(
            f"shared_intermediate_size must be >= 0, got {cfg.shared_intermediate_size}")
    shared_ok = (*MAMBA_ARCHITECTURES, "granitemoeshared")
    if cfg.shared_intermediate_size and cfg.architecture not in shared_ok:
        raise ModelConfigError(f"shared_intermediate_size does not fit architecture "
                               f"{cfg.architecture!r} (only {', '.join(shared_ok)})")
    if not cfg.mamba:
        if cfg.mamba_n_heads:
            raise ModelConfigError(
                f"Mamba2 layers (mamba_n_heads) do not fit architecture {cfg.architecture!r} "
                f"(only {', '.join(MAMBA_ARCHITECTURES)})")
        return
    if not _has_linear_layers(cfg, _MAMBA_DIMS):
        return
    granite = cfg.architecture == "granitemoehybrid"  # (Nemotron-H's width is its heads')
    if granite and cfg.mamba_d_inner != cfg.mamba_expand * cfg.hidden_size:
        raise ModelConfigError(
            f"mamba_n_heads {cfg.mamba_n_heads} x mamba_d_head {cfg.mamba_d_head} must be "
            f"mamba_expand {cfg.mamba_expand} x hidden_size {cfg.hidden_size}")
    if cfg.mamba_n_heads % cfg.mamba_n_groups:
        raise ModelConfigError(f"mamba_n_heads {cfg.mamba_n_heads} is not a multiple of "
                               f"mamba_n_groups {cfg.mamba_n_groups}")
    low, high = cfg.time_step_limit
    if not 0 <= low < high:
        raise ModelConfigError(f"time_step_limit {list(cfg.time_step_limit)} must be "
                               "[low, high] with 0 <= low < high")
    if cfg.sliding_layers:
        raise ModelConfigError(f"sliding windows do not fit a hybrid {cfg.architecture!r} "
                               "model")


def _latent(cfg: ModelConfig) -> None:
    dims = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
            "v_head_dim")
    if cfg.architecture not in LATENT_ARCHITECTURES:
        if any(getattr(cfg, name) for name in dims) or cfg.rope_interleave:
            raise ModelConfigError(
                f"latent attention ({', '.join(dims)}, rope_interleave) does not fit "
                f"architecture {cfg.architecture!r} (only "
                f"{', '.join(LATENT_ARCHITECTURES)} has it)")
        return
    for name in dims[1:]:
        if getattr(cfg, name) <= 0:
            raise ModelConfigError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.q_lora_rank < 0:
        raise ModelConfigError(f"q_lora_rank must be >= 0 (0: none), got {cfg.q_lora_rank}")
    if cfg.head_dim != cfg.qk_nope_head_dim + cfg.qk_rope_head_dim:
        raise ModelConfigError(
            f"head_dim {cfg.head_dim} must be qk_nope_head_dim {cfg.qk_nope_head_dim} + "
            f"qk_rope_head_dim {cfg.qk_rope_head_dim} in latent attention")
    if cfg.num_key_value_heads != cfg.num_attention_heads:
        raise ModelConfigError(
            f"num_key_value_heads {cfg.num_key_value_heads} must be num_attention_heads "
            f"{cfg.num_attention_heads} in latent attention (every head its own key)")
    if cfg.v_head_dim > cfg.head_dim:
        raise ModelConfigError(
            f"v_head_dim {cfg.v_head_dim} wider than a key's {cfg.head_dim} is not "
            "supported by the embedded engine")
    if cfg.partial_rotary_factor != 1.0 or cfg.qk_rope_head_dim % 2:
        raise ModelConfigError(
            f"qk_rope_head_dim {cfg.qk_rope_head_dim} must be even and "
            f"partial_rotary_factor 1.0 in latent attention")

def _experts(cfg: ModelConfig) -> None:
    if cfg.num_experts < 0:
        raise ModelConfigError(f"num_experts must be >= 0, got {cfg.num_experts}")
    if not cfg.num_experts:
        return
    if cfg.architecture not in MOE_ARCHITECTURES:
        raise ModelConfigError(
            f"num_experts={cfg.num_experts} does not fit architecture "
            f"{cfg.architecture!r} (only {', '.join(MOE_ARCHITECTURES)} have experts)"
        )
    if not 1 <= cfg.num_experts_per_tok <= cfg.num_experts:
        raise ModelConfigError(
            f"num_experts_per_tok must be in [1, num_experts={cfg.num_experts}], got "
            f"{cfg.num_experts_per_tok}"
        )
    for name in ("moe_intermediate_size", "decoder_sparse_step"):
        if getattr(cfg, name) <= 0:
            raise ModelConfigError(f"{name} must be positive, got {getattr(cfg, name)}")
    _inside(cfg, "mlp_only_layers")
    _router(cfg)

def _router(cfg: ModelConfig) -> None:
    if cfg.scoring_func not in SCORING_FUNCS:
        raise ModelConfigError(f"scoring_func {cfg.scoring_func!r} is not one of "
                               f"{', '.join(SCORING_FUNCS)}")
    for name in ("n_shared_experts", "shared_expert_intermediate_size"):
        if getattr(cfg, name) < 0:
            raise ModelConfigError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    if not cfg.routed_scaling_factor > 0:
        raise ModelConfigError(
            f"routed_scaling_factor must be positive, got {cfg.routed_scaling_factor}")
    if cfg.n_group < 1 or cfg.num_experts % cfg.n_group:
        raise ModelConfigError(f"n_group {cfg.n_group} does not divide num_experts "
                               f"{cfg.num_experts} into groups")
    if not 1 <= cfg.topk_group <= cfg.n_group:
        raise ModelConfigError(
            f"topk_group must be in [1, n_group={cfg.n_group}], got {cfg.topk_group}")
    per_group = cfg.num_experts // cfg.n_group
    # (a softmax router's groups: DeepSeek-V2's rank by their best, Mistral 4's by two)
    softmax_groups = cfg.architecture in ("deepseek_v2", "mistral4")
    if cfg.n_group > 1 and not softmax_groups and (cfg.scoring_func != "sigmoid"
                                                   or per_group < 2):
        raise ModelConfigError(
            f"n_group={cfg.n_group} needs scoring_func 'sigmoid' and at least 2 experts "
            f"a group (a group ranks by its two best), got {cfg.scoring_func!r} and "
            f"{per_group}")
    if cfg.num_experts_per_tok > cfg.topk_group * per_group:
        raise ModelConfigError(
            f"num_experts_per_tok {cfg.num_experts_per_tok} is more than the "
            f"{cfg.topk_group * per_group} experts of topk_group={cfg.topk_group} groups")
