"""A decoder's architecture as pivotflow reads it from a Hugging Face ``config.json``
(``hf_config.config_from_hf``): the families it runs, and ``ModelConfig``, the frozen, hashable
description the trainer's ``Decoder`` and the engine's packed decoder are built from.
"""

from __future__ import annotations

import math

import msgspec

from pivotflow.engines.torch.architectures import (
    BLOCK_ARCHITECTURES,
    EMBED_SCALED_ARCHITECTURES,
    GATED_ATTENTION_ARCHITECTURES,
    MAMBA_ARCHITECTURES,
    OFFSET_NORM_ARCHITECTURES,
    POST_NORM_ARCHITECTURES,
    QK_NORM_AFTER_ROPE_ARCHITECTURES,
    QK_NORM_ARCHITECTURES,
    SANDWICH_NORM_ARCHITECTURES,
    WHOLE_QK_NORM_ARCHITECTURES,
)


class ModelConfig(msgspec.Struct, kw_only=True, frozen=True):
    """Architecture of a decoder. Field names are Hugging Face's where HF has one, so
    config.json maps onto it (``weights.config_from_hf``/``config_to_hf``). Frozen and hashable:
    it keys caches of expected tensor shapes.

    ``head_dim`` 0 and ``qk_norm`` None mean "derive": hidden_size // num_attention_heads, and
    whether the architecture is qwen3. They are filled in at construction, so a config built
    with or without them compares (and hashes) equal. The ``rope_*`` fields flatten HF's
    ``rope_parameters``/``rope_scaling`` dict into hashable scalars.
    """

    vocab_size: int
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 0
    max_position_embeddings: int = 64
    rope_theta: float = 10000.0
    rope_type: str = "default"  # one of ROPE_TYPES
    rope_factor: float = 1.0  # linear, llama3 and yarn
    rope_low_freq_factor: float = 1.0  # llama3
    rope_high_freq_factor: float = 4.0  # llama3
    rope_original_max_position_embeddings: int = 0  # llama3 and yarn (0: max_position_embeddings)
    # YaRN (arXiv:2309.00071; HF's keys without the prefix): the band between beta_fast and
    # beta_slow rotations over the original length blends interpolation into extrapolation, and
    # cos/sin are scaled by attention_factor (0: derived from factor, mscale and mscale_all_dim).
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_attention_factor: float = 0.0
    rope_mscale: float = 0.0
    rope_mscale_all_dim: float = 0.0
    rope_truncate: bool = True  # round the blended band's ends outward to whole dimensions
    # Ministral 3's (Llama 4's) query scale by position: q times 1 + beta log(1 + floor(p / L)),
    # L the original context (rope_original_max_position_embeddings); 0: none
    llama4_scaling_beta: float = 0.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    attention_bias: bool = True  # Qwen2 always has q/k/v biases; Llama/Qwen3 per config.
    qk_norm: bool | None = None
    architecture: str = "qwen2"  # one of ARCHITECTURES
    # A sequence classifier (HF's *ForSequenceClassification, e.g. a reward model): a ``score``
    # head of this many outputs over the last token instead of ``lm_head``; 0: a causal LM.
    num_labels: int = 0
    # Qwen3-MoE (HF's names): ``num_experts`` routed experts of ``moe_intermediate_size`` each,
    # ``num_experts_per_tok`` of them per token, on every ``decoder_sparse_step``-th layer but
    # ``mlp_only_layers`` (those keep a dense MLP of ``intermediate_size``). 0 experts: dense.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # renormalise the chosen experts' router weights to sum to 1
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    # GLM-4.5's router (DeepSeek-V3's, HF's names): experts scored by ``scoring_func``; with
    # sigmoid, a token's experts are chosen by score plus the layer's correction bias, among the
    # ``topk_group`` best of ``n_group`` groups of experts (a group ranked by its two best), and
    # weighed by their scores (renormalised when norm_topk_prob) times ``routed_scaling_factor``.
    # ``n_shared_experts``: an MLP of that many experts' width every token also goes through.
    scoring_func: str = "softmax"  # one of SCORING_FUNCS
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    n_shared_experts: int = 0
    # Qwen2-MoE's shared expert: an MLP of this width every token goes through, its output
    # scaled by a sigmoid of a learned gate (``shared_expert_gate``); 0: none
    shared_expert_intermediate_size: int = 0
    # gpt-oss's experts (HF's names; 0: plain SwiGLU without biases): biased projections and
    # a clamped gate, gate = min(gate, limit), up = clamp(up, -limit, limit),
    # (up + 1) * gate * sigmoid(alpha * gate); its router has a bias too, its attention a
    # learned sink per head (a logit every query's softmax also spreads over, valued zero)
    swiglu_alpha: float = 0.0
    swiglu_limit: float = 0.0
    # Sliding-window attention (HF's layer_types "sliding_attention"): on these layers a token
    # attends to the last ``sliding_window`` positions, itself included (transformers' window:
    # key j is seen from query i when i - window < j <= i); the others attend to all.
    # ``sliding_rope_theta`` > 0: those layers take plain RoPE at that base while the others
    # keep the config's rope (OLMo-3: its YaRN only on full layers); 0: one rope for all.
    sliding_window: int = 0
    sliding_layers: tuple[int, ...] = ()
    sliding_rope_theta: float = 0.0
    # layers that turn no position into q and k (SmolLM3's NoPE layers: no_rope_layers 0)
    nope_layers: tuple[int, ...] = ()
    # LongRoPE (Phi-3.5-mini, Phi-4-mini; HF's short_factor/long_factor): a divisor per rotary
    # frequency. transformers takes the short set for any sequence within
    # rope_original_max_position_embeddings and the long one, for every position, past it;
    # pivotflow runs the short set and no longer sequences (``context_limit``), so its trainer
    # and engines agree on every token. The long set is kept to write the config back. Its
    # cos/sin scale by rope_attention_factor (0: sqrt(1 + ln(factor) / ln(original))).
    rope_short_factor: tuple[float, ...] = ()
    rope_long_factor: tuple[float, ...] = ()
    # the fraction of each head that rotates (Phi-4-mini: 0.75; the rest passes through)
    partial_rotary_factor: float = 1.0
    hidden_act: str = "silu"  # one of ACTIVATIONS
    # attention scores scale by query_pre_attn_scalar ** -0.5 (Gemma's; 0: head_dim's)
    query_pre_attn_scalar: float = 0.0
    # Gemma 2's soft-capping (HF's names; 0: none): attention scores become
    # cap * tanh(score / cap) before the mask and softmax, a causal LM's logits likewise
    attn_logit_softcapping: float = 0.0
    final_logit_softcapping: float = 0.0
    # Granite's multipliers (HF's names): embeddings times embedding_multiplier, each
    # sub-layer's output times residual_multiplier before its residual add, attention scores
    # times attention_multiplier (0: head_dim ** -0.5), a causal LM's logits divided by
    # logits_scaling
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float = 0.0
    logits_scaling: float = 1.0
    # DeepSeek-V2's and V3's multi-head latent attention (HF's names; kv_lora_rank 0: none).
    # Keys and values come from one latent of kv_lora_rank per token (kv_a_proj_with_mqa,
    # normalised, then kv_b_proj into every head's key part and value) and one rotary key of
    # qk_rope_head_dim that every head shares; queries through a latent of q_lora_rank (0:
    # q_proj directly). A head's q and k are qk_nope_head_dim + qk_rope_head_dim wide
    # (head_dim), the rotary part last (in interleaved pairs when rope_interleave), its value
    # v_head_dim; scores scale by head_dim ** -0.5, times YaRN's mscale_all_dim term squared.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False
    # Qwen3.5's gated DeltaNet (HF's names; ``linear_attention_layers`` empty: none), on the
    # layers HF's layer_types marks "linear_attention": q and k of linear_num_key_heads x
    # linear_key_head_dim and v of linear_num_value_heads x linear_value_head_dim, through a
    # causal depthwise convolution of linear_conv_kernel_dim taps, read from and written to a
    # per-sequence state (``gated_deltanet``). Its full-attention layers gate their output.
    linear_attention_layers: tuple[int, ...] = ()
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    # LFM2's short convolutions (on ``linear_attention_layers``; linear_conv_kernel_dim taps,
    # its conv_L_cache): biased projections and convolution when conv_bias
    conv_bias: bool = False
    # OLMo Hybrid's delta rule writes at up to twice the rate (beta = 2 sigmoid(b): the state's
    # update may have negative eigenvalues)
    linear_allow_neg_eigval: bool = False
    # Granite 4.0-H's Mamba2 layers (HF's names; on ``linear_attention_layers``, which HF's
    # layer_types marks "mamba"): an input projection into a gate of mamba_expand * hidden_size,
    # x (mamba_n_heads heads of mamba_d_head), B and C (mamba_n_groups groups of mamba_d_state,
    # each shared by its heads) and a time step per head; x, B and C through a causal depthwise
    # convolution of mamba_d_conv taps (biased when mamba_conv_bias); the time step softplus'd
    # and clamped to time_step_limit; a per-head state [mamba_d_head, mamba_d_state] decayed by
    # exp(dt * A) and written dt x B^T each token, read by C (``mamba2``)
    mamba_n_heads: int = 0
    mamba_d_head: int = 0
    mamba_n_groups: int = 1
    mamba_d_state: int = 0
    mamba_d_conv: int = 0
    mamba_expand: int = 2
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    time_step_limit: tuple[float, float] = (0.0, math.inf)
    # Nemotron-H's layers that are an MLP alone (its "-" blocks); every other layer of a
    # nemotron_h model is a mixer alone (Mamba2, "M", or attention, "*")
    mlp_blocks: tuple[int, ...] = ()
    # Granite 4.0's shared MLP beside its experts, Nemotron-H's shared expert: an ungated shared
    # expert of this width (``mlp.shared_experts``); 0: n_shared_experts experts' width
    shared_intermediate_size: int = 0
    # Gemma 4's full-attention layers (those not in sliding_layers): heads of global_head_dim
    # (0: head_dim) on num_global_key_value_heads key/value heads (0: num_key_value_heads);
    # attention_k_eq_v: their values are their keys' projection (no v_proj), taken before k's
    # norm and rope. Its values are RMS-normalised without a scale, its scores unscaled (its
    # q/k norms set their size) and each layer's output multiplied by a scalar of its own
    # (``layer_scalar``, a constant of the checkpoint).
    global_head_dim: int = 0
    num_global_key_value_heads: int = 0
    attention_k_eq_v: bool = False
    # Gemma 4 E2B's and E4B's per-layer inputs (HF's names; 0: none): each token's embedding
    # of hidden_size_per_layer_input per layer (from a table of vocab_size_per_layer_input
    # tokens) mixed with a projection of its input embedding, gating a residual branch after
    # each layer's MLP; and its last num_kv_shared_layers layers' attention reusing the keys
    # and values of the last earlier layer of their type (no k/v projections of their own), their
    # MLPs twice as wide where use_double_wide_mlp
    hidden_size_per_layer_input: int = 0
    vocab_size_per_layer_input: int = 0
    num_kv_shared_layers: int = 0
    use_double_wide_mlp: bool = False
    # Llama 4's (HF's names): its sliding_layers attend within chunks of attention_chunk_size
    # positions (key j seen from query i when j // C == i // C and j <= i), not a window
    # (sliding_window is then C: no key further back; 0: windows as the others'); its NoPE
    # layers' queries scaled by position, 1 + attn_scale * log(1 + floor((p + 1) / floor_scale))
    # (attn_temperature_tuning; attn_scale 0: none); weightless_qk_norm (its use_qk_norm): q
    # and k RMS-normalised per head without a weight on its rope layers
    attention_chunk_size: int = 0
    attn_scale: float = 0.0
    floor_scale: float = 8192.0
    weightless_qk_norm: bool = False

    def __post_init__(self) -> None:
        # Derived defaults; force_setattr because the struct is frozen.
        if not self.head_dim and self.num_attention_heads > 0:
            msgspec.structs.force_setattr(
                self, "head_dim", self.hidden_size // self.num_attention_heads
            )
        if self.qk_norm is None:
            msgspec.structs.force_setattr(
                self, "qk_norm", self.architecture in QK_NORM_ARCHITECTURES
            )

    @property
    def sandwich_norm(self) -> bool:
        """Gemma's, GLM-4's and AFMoE's layer: four norms (each sub-layer's input and
        output)."""
        return self.architecture in SANDWICH_NORM_ARCHITECTURES

    @property
    def norm_offset(self) -> bool:
        """Gemma's and Qwen3.5's: every norm scales by 1 + weight."""
        return self.architecture in OFFSET_NORM_ARCHITECTURES

    @property
    def embed_scaled(self) -> bool:
        """Gemma's: embeddings times sqrt(hidden_size)."""
        return self.architecture in EMBED_SCALED_ARCHITECTURES

    @property
    def attn_output_gate(self) -> bool:
        """Qwen3.5's full attention (and AFMoE's, its gate held inside q_proj): q_proj also
        gives a gate per head and dimension, and the attention's output times its sigmoid goes
        into o_proj."""
        return self.architecture in GATED_ATTENTION_ARCHITECTURES

    @property
    def linear_norm_eps(self) -> float:
        """The gated DeltaNet's output norm's epsilon: OLMo Hybrid's 1e-5 (fla's), the others'
        rms_norm_eps."""
        return 1e-5 if self.architecture == "olmo_hybrid" else self.rms_norm_eps

    def is_post_norm(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` normalises its sub-layers' outputs (OLMo-2's and
        OLMo-3's layers; OLMo Hybrid's attention layers, its DeltaNet ones pre-norm)."""
        if self.architecture == "olmo_hybrid":
            return not self.is_linear(layer)
        return self.post_norm

    def is_linear(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` is a gated DeltaNet or a Mamba2 layer (no KV cache:
        a state)."""
        return layer in self.linear_attention_layers

    def has_mixer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` has attention or a linear mixer (all but
        Nemotron-H's MLP blocks)."""
        return layer not in self.mlp_blocks

    def has_mlp(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` has an MLP (all but Nemotron-H's mixer blocks)."""
        return self.architecture not in BLOCK_ARCHITECTURES or layer in self.mlp_blocks

    @property
    def mlp_gated(self) -> bool:
        """Whether the MLP gates its up projection (SwiGLU, GeGLU); Nemotron-H's, Arcee's and
        Apertus's do not."""
        return self.hidden_act not in ("relu2", "xielu")

    @property
    def short_conv(self) -> bool:
        """Whether the linear layers are LFM2's gated short convolutions (LFM2-MoE's too)."""
        return self.architecture in ("lfm2", "lfm2_moe")

    @property
    def router_norm_eps(self) -> float:
        """What a sigmoid router adds to its chosen scores' sum as it renormalises them:
        transformers' 1e-20 (GLM-4.5's, DeepSeek-V3's), LFM2-MoE's 1e-6."""
        return 1e-6 if self.architecture == "lfm2_moe" else 1e-20

    @property
    def mamba(self) -> bool:
        """Whether the linear layers are Mamba2's (Granite 4.0-H's), not gated DeltaNets."""
        return self.architecture in MAMBA_ARCHITECTURES

    @property
    def mamba_d_inner(self) -> int:
        """A Mamba2 layer's inner width: its heads', its gate's, out_proj's input."""
        return self.mamba_n_heads * self.mamba_d_head

    @property
    def shared_width(self) -> int:
        """The ungated shared expert's width (GLM-4.5's, DeepSeek's, Granite 4.0's; 0: none)."""
        return self.shared_intermediate_size or self.moe_intermediate_size * self.n_shared_experts

    def kv_source(self, layer: int) -> int:
        """The layer whose keys and values decoder layer ``layer`` attends over: its own, or
        for Gemma 4's last num_kv_shared_layers, the last layer of their type before them."""
        first = self.num_hidden_layers - self.num_kv_shared_layers
        if layer < first:
            return layer
        sliding = self.is_sliding(layer)
        return max(i for i in range(first) if self.is_sliding(i) == sliding)

    @property
    def experts_beside_mlp(self) -> bool:
        """Gemma 4's sparse layers (gemma-4-26B-A4B's): a routed mixture of experts beside the
        dense MLP (``DecoderLayer.moe``), its router on the layer's unnormalised input."""
        return self.architecture == "gemma4_text" and self.num_experts > 0

    def layer_intermediate(self, layer: int) -> int:
        """Decoder layer ``layer``'s dense MLP width (Gemma 4's KV-sharing layers' twice
        intermediate_size where use_double_wide_mlp)."""
        shared = self.kv_source(layer) != layer
        return self.intermediate_size * (2 if shared and self.use_double_wide_mlp else 1)

    @property
    def cached_layers(self) -> tuple[int, ...]:
        """The attention layers whose keys and values an engine caches (all but those that
        attend over another layer's: Gemma 4's KV-sharing ones)."""
        return tuple(i for i in self.attention_layers if self.kv_source(i) == i)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers that attend over cached keys and values (all but the linear ones and
        Nemotron-H's MLP blocks)."""
        return tuple(i for i in range(self.num_hidden_layers)
                     if not self.is_linear(i) and self.has_mixer(i))

    @property
    def attention_scale(self) -> float:
        """What q.k is multiplied by before the softmax."""
        if self.architecture == "gemma4_text":  # (its q and k norms set the scores' size)
            return 1.0
        if self.attention_multiplier:  # (Granite's)
            return self.attention_multiplier
        scale = (self.query_pre_attn_scalar or self.head_dim) ** -0.5
        yarn = self.rope_type == "yarn" and self.rope_factor > 1
        if self.latent_attention and yarn and self.rope_mscale_all_dim:
            # DeepSeek's: YaRN's temperature on the non-rotary dimensions too (transformers'
            # yarn_apply_mscale)
            scale *= (0.1 * self.rope_mscale_all_dim * math.log(self.rope_factor) + 1) ** 2
        return scale

    @property
    def group_rank_top(self) -> int:
        """How many of a group's best scores rank it in grouped routing: DeepSeek-V2's softmax
        router's, its best (group_limited_greedy); DeepSeek-V3's and GLM-4.5's, its two best."""
        return 1 if self.architecture == "deepseek_v2" else 2

    @property
    def latent_attention(self) -> bool:
        """DeepSeek-V2's and V3's multi-head latent attention (``kv_lora_rank``)."""
        return self.kv_lora_rank > 0

    @property
    def cache_kv_heads(self) -> int:
        """The key/value heads an engine caches per position: latent attention's one latent
        (every head reads it), else num_key_value_heads."""
        return 1 if self.latent_attention else self.num_key_value_heads

    @property
    def cache_head_dim(self) -> int:
        """The width of each cached key (and value): latent attention's latent and rotary key
        (kv_lora_rank + qk_rope_head_dim), else head_dim."""
        return self.kv_lora_rank + self.qk_rope_head_dim if self.latent_attention else self.head_dim

    def layer_cache_shape(self, layer: int) -> tuple[int, int]:
        """(key/value heads, width) an engine caches per position for attention layer
        ``layer``: ``cache_kv_heads`` and ``cache_head_dim``, but Gemma 4's full layers'
        their own."""
        if self.latent_attention:
            return self.cache_kv_heads, self.cache_head_dim
        return self.layer_kv_heads(layer), self.layer_head_dim(layer)

    @property
    def attention_sinks(self) -> bool:
        """gpt-oss's and Granite SWA's attention: a learned sink logit per head
        (``self_attn.sinks``)."""
        return self.architecture in ("gpt_oss", "granite_swa")

    @property
    def whole_qk_norm(self) -> bool:
        """OLMo-2's, OLMo-3's and OLMoE's q/k norms: over the whole projection (each one
        weight per q or k unit), before it is cut into heads; the others' are per head."""
        return self.architecture in WHOLE_QK_NORM_ARCHITECTURES

    @property
    def router_bias(self) -> bool:
        """Whether a sparse layer's router chooses with a correction bias
        (``e_score_correction_bias``: a load statistic that chooses, never weighs; frozen) and
        computes its logits in float32: every sigmoid router's (DeepSeek-V3's, GLM-4.5's...)
        and ERNIE 4.5 MoE's softmax one."""
        if self.architecture == "llama4_text":  # (its sigmoid router: no bias, model dtype)
            return False
        return self.scoring_func == "sigmoid" or self.architecture == "ernie4_5_moe"

    @property
    def router_scales_input(self) -> bool:
        """Llama 4's experts: each reads the token times its router weight (and its output is
        summed unweighted), not the token with its output weighed."""
        return self.architecture == "llama4_text"

    @property
    def qk_norm_after_rope(self) -> bool:
        """Hunyuan's q/k norms: per head, on the rotated q and k (the others' before rope)."""
        return self.architecture in QK_NORM_AFTER_ROPE_ARCHITECTURES

    @property
    def post_norm(self) -> bool:
        """OLMo-2's and OLMo-3's layer: norms on the attention's and the MLP's outputs (and q/k
        normalised over the whole projection), none on their inputs."""
        return self.architecture in POST_NORM_ARCHITECTURES

    @property
    def o_proj_bias(self) -> bool:
        """Whether o_proj has a bias: Qwen2, Qwen2-MoE, GLM-4, GLM-4.5, Solar Open and Seed-OSS
        never (Seed-OSS's
        ``attention_out_bias`` true is refused); Llama, Mistral and Qwen3 when attention_bias."""
        return self.attention_bias and self.architecture not in ("qwen2", "glm4", "glm4_moe",
                                                                 "qwen2_moe", "seed_oss",
                                                                 "solar_open")

    @property
    def rotary_dim(self) -> int:
        """How many of each head's dimensions rotate: the first ones, as transformers, but in
        latent attention the last qk_rope_head_dim (Gemma 4's proportional rope: all, some at
        frequency 0)."""
        if self.latent_attention:
            return self.qk_rope_head_dim
        if self.rope_type == "proportional":
            return self.head_dim
        return int(self.head_dim * self.partial_rotary_factor)

    def layer_head_dim(self, layer: int) -> int:
        """The width of decoder layer ``layer``'s query, key and value heads (Gemma 4's full
        layers': global_head_dim)."""
        return self.global_head_dim if self.global_layer(layer) else self.head_dim

    def layer_kv_heads(self, layer: int) -> int:
        """How many key/value heads decoder layer ``layer`` has (Gemma 4's full layers':
        num_global_key_value_heads)."""
        if self.global_layer(layer) and self.num_global_key_value_heads:
            return self.num_global_key_value_heads
        return self.num_key_value_heads

    def layer_k_eq_v(self, layer: int) -> bool:
        """Whether decoder layer ``layer``'s values are its keys' projection (Gemma 4's full
        layers with attention_k_eq_v)."""
        return self.attention_k_eq_v and not self.is_sliding(layer)

    def global_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` is one of Gemma 4's full layers with their own head
        width (global_head_dim)."""
        return bool(self.global_head_dim) and not self.is_sliding(layer)

    def kind_rotary_dim(self, kind: str) -> int:
        """The rotary dimensions of a rope kind's heads (``rope_kind``): Gemma 4's full layers'
        global_head_dim, else ``rotary_dim``."""
        return self.global_head_dim if kind == "full" and self.global_head_dim else self.rotary_dim

    @property
    def parallel_block(self) -> bool:
        """Cohere's layer (Command R's, R7B's): attention and the MLP read one normed input
        side by side, both added to the residual (``x + attn(norm(x)) + mlp(norm(x))``); its
        norms LayerNorm's (``centered_norm``)."""
        return self.architecture in ("cohere", "cohere2")

    @property
    def qk_norm_per_head(self) -> bool:
        """Command R+'s q/k norms: a weight of its own for each head ([heads, head_dim]), not
        one all heads share."""
        return self.architecture == "cohere" and bool(self.qk_norm)

    @property
    def centered_norm(self) -> bool:
        """Cohere's norms: LayerNorm without a bias (mean removed), not RMSNorm;
        ``rms_norm_eps`` holds its layer_norm_eps."""
        return self.architecture in ("cohere", "cohere2")

    @property
    def value_norm(self) -> bool:
        """Gemma 4's: each value head RMS-normalised, without a scale."""
        return self.architecture == "gemma4_text"

    @property
    def layer_scalars(self) -> bool:
        """Gemma 4's: each layer's output times its ``layer_scalar``."""
        return self.architecture == "gemma4_text"

    @property
    def context_limit(self) -> int:
        """The longest sequence the decoder runs: the original context for LongRoPE (whose
        long factors it does not run), else max_position_embeddings."""
        if self.rope_type == "longrope":
            return self.rope_original_max_position_embeddings or self.max_position_embeddings
        return self.max_position_embeddings

    @property
    def context_key(self) -> str:
        """The config.json key ``context_limit`` comes from (what an error names)."""
        longrope = self.rope_type == "longrope" and self.rope_original_max_position_embeddings
        return "original_max_position_embeddings" if longrope else "max_position_embeddings"

    def is_sparse(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` routes to experts (as transformers' Qwen3-MoE
        decides)."""
        return (
            self.num_experts > 0
            and self.has_mlp(layer)
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    def rope_kind(self, layer: int) -> str:
        """Which rotary table decoder layer ``layer`` takes: "none" (a NoPE layer, SmolLM3's),
        "sliding" (a sliding-window layer with its own ``sliding_rope_theta``) or "full"."""
        if layer in self.nope_layers:
            return "none"
        return "sliding" if self.is_sliding(layer) and self.sliding_rope_theta else "full"

    def is_sliding(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` attends within a sliding window (Llama 4's: within
        its chunk, ``attention_chunk_size``)."""
        return layer in self.sliding_layers

    @property
    def sparse_layers(self) -> int:
        """How many layers route to experts."""
        return sum(self.is_sparse(i) for i in range(self.num_hidden_layers))

    def validate(self) -> ModelConfig:
        """Return self; raise ModelConfigError naming the first inconsistent field
        (``model_config_checks``)."""
        from pivotflow.engines.torch.model_config_checks import check

        check(self)
        return self
