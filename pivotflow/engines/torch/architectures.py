"""The decoder families pivotflow runs (HF's ``model_type`` names) and the sets of them that share
a part of the math (``ModelConfig``'s properties read these): kept apart from ``model_config``,
which re-exports them, so a family's line is found in one short file.
"""

from __future__ import annotations

ARCHITECTURES = ("qwen2", "llama", "mistral", "qwen3", "qwen3_moe", "olmo2", "olmo3",
                 "gemma3_text", "phi3", "mixtral", "glm4", "glm4_moe", "smollm3", "qwen2_moe",
                 "gemma2", "olmoe", "granite", "gpt_oss", "deepseek_v3", "deepseek_v2",
                 "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "granitemoehybrid",
                 "nemotron_h", "minimax_m2", "olmo_hybrid", "exaone4", "ernie4_5", "lfm2",
                 "seed_oss", "hunyuan_v1_dense", "hunyuan_v1_moe", "ernie4_5_moe",
                 "ministral3", "glm4_moe_lite", "lfm2_moe", "dots1", "mistral4",
                 "solar_open", "arcee", "afmoe", "apertus", "hy_v3", "granite_swa",
                 "minicpm5_moe", "gemma4_text", "granitemoe", "granitemoeshared", "cohere2",
                 "cohere", "llama4_text")
# the families with routed experts
MOE_ARCHITECTURES = ("qwen3_moe", "mixtral", "glm4_moe", "qwen2_moe", "olmoe", "gpt_oss",
                     "deepseek_v3", "deepseek_v2", "qwen3_5_moe_text", "qwen3_next",
                     "granitemoehybrid", "nemotron_h", "minimax_m2", "hunyuan_v1_moe",
                     "ernie4_5_moe", "glm4_moe_lite", "lfm2_moe", "dots1", "mistral4",
                     "solar_open", "afmoe", "hy_v3", "minicpm5_moe", "gemma4_text",
                     "granitemoe", "granitemoeshared", "llama4_text")
# multi-head latent attention (DeepSeek-V2's and V3's, ``kv_lora_rank``)
LATENT_ARCHITECTURES = ("deepseek_v3", "deepseek_v2", "glm4_moe_lite", "mistral4")
QK_NORM_ARCHITECTURES = ("qwen3", "qwen3_moe", "olmo2", "olmo3", "gemma3_text", "olmoe",
                         "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "minimax_m2",
                         "olmo_hybrid", "exaone4", "lfm2", "hunyuan_v1_dense", "hunyuan_v1_moe",
                         "lfm2_moe", "dots1", "afmoe", "apertus", "hy_v3", "gemma4_text")
# Qwen3.5's, Qwen3-Next's and OLMo Hybrid's: gated DeltaNet (linear attention) on most layers,
# full attention on the rest (``linear_attention_layers``); Qwen's gated (GATED_ATTENTION)
HYBRID_ARCHITECTURES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "olmo_hybrid")
GATED_ATTENTION_ARCHITECTURES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "afmoe",
                                 "minicpm5_moe")
# Granite 4.0's: Mamba2 layers (``mamba2``) on ``linear_attention_layers`` (Granite 4.0-H's
# most layers; none in the dense Granite 4.0), attention on the rest
MAMBA_ARCHITECTURES = ("granitemoehybrid", "nemotron_h")
# Granite's MoE layers (Granite 3's and 4.0's), whose sub-layer outputs scale by
# residual_multiplier as a dense layer's, and Nemotron-H's
RESIDUAL_SCALED_MOE = (*MAMBA_ARCHITECTURES, "granitemoe", "granitemoeshared")
# Nemotron-H's: each layer one block (Mamba2, attention, or an MLP: ``mlp_blocks``), not a
# mixer and an MLP; its MLPs ungated, relu(x)^2
BLOCK_ARCHITECTURES = ("nemotron_h",)
# q and k normalised over their whole projections (all heads at once), not per head
WHOLE_QK_NORM_ARCHITECTURES = ("olmo2", "olmo3", "olmoe", "minimax_m2", "olmo_hybrid")
# (their use_qk_norm says: GLM-4.5's, Command R+'s)
OPTIONAL_QK_NORM_ARCHITECTURES = ("glm4_moe", "cohere")
# q and k normalised per head after rope, not before (Hunyuan's)
QK_NORM_AFTER_ROPE_ARCHITECTURES = ("hunyuan_v1_dense", "hunyuan_v1_moe")
# how a router scores experts: a softmax over all (Qwen3-MoE, Mixtral), each by a sigmoid,
# chosen with a load-balancing bias added (DeepSeek-V3's and GLM-4.5's, ``e_score_correction_bias``),
# or the top k logits chosen and a softmax over those alone (gpt-oss's)
SCORING_FUNCS = ("softmax", "sigmoid", "topk_softmax")
# Gemma's, GLM-4's and AFMoE's layer: norms on each sub-layer's input and output
SANDWICH_NORM_ARCHITECTURES = ("gemma3_text", "glm4", "gemma2", "afmoe", "gemma4_text")
# norms that scale by 1 + weight (weights start at 0): Gemma's (whose embeddings also scale by
# sqrt(hidden_size): EMBED_SCALED_ARCHITECTURES) and Qwen3.5's
OFFSET_NORM_ARCHITECTURES = ("gemma3_text", "gemma2", "qwen3_5_text", "qwen3_5_moe_text",
                             "qwen3_next")
EMBED_SCALED_ARCHITECTURES = ("gemma3_text", "gemma2", "gemma4_text")
# the MLP's gate (HF's hidden_act names); relu2 (relu(x)^2) is Nemotron-H's and Arcee's
# ungated MLPs'
GATED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
# (and Apertus's xIELU, ungated, with learned scalars in each layer: feedforward.XIELU)
ACTIVATIONS = (*GATED_ACTIVATIONS, "relu2", "xielu")
# norms on each sub-layer's output ("post-norm"): OLMo-2's and OLMo-3's (q and k normalised
# over the whole projection), EXAONE 4.0's (q and k per head)
POST_NORM_ARCHITECTURES = ("olmo2", "olmo3", "exaone4")
# (layers without rope: SmolLM3's some, Granite 4.0-H's all, AFMoE's full ones)
NOPE_ARCHITECTURES = ("smollm3", "granitemoehybrid", "nemotron_h", "olmo_hybrid", "exaone4",
                      "cohere2", "afmoe", "granite_swa", "llama4_text")
# ("proportional": Gemma 4's full layers' rope, every dimension paired by rotate_half over the
# whole head, the first partial_rotary_factor of the frequencies turning, the rest at 0)
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "proportional")
