"""Tiny random-weight models that transformers itself builds and saves, one per family and
feature the embedded engine claims (Qwen2, Llama 3 with rope scaling, Qwen3 with q/k norms and a
head_dim that is not hidden/heads, Qwen3-MoE with a dense layer among its sparse ones, Mistral,
Qwen3 with YaRN, OLMo-2, Gemma 3, Phi-3 with its fused projections, Phi-4-mini's partial
rotary and LongRoPE, Mixtral, GLM-4, GLM-4.5, SmolLM3's NoPE layers, Qwen2-MoE's gated shared expert, Gemma 2's soft-capping, OLMoE, Granite's multipliers, gpt-oss's sinks and experts, DeepSeek-V3's and V2's latent attention, Qwen3.5's gated DeltaNet, Granite 4.0-H's Mamba2, Nemotron-H's one-block layers, MiniMax-M2's sigmoid router, OLMo Hybrid, EXAONE 4.0, ERNIE 4.5's interleaved rope, LFM2's short convolutions, sliding windows that bind (Mistral v0.1's, Qwen2's, OLMo-3's,
Phi-3's, Mixtral's); tied and untied), and a reference greedy decode."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

VOCAB = 300
SIZES: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,  # head_dim 32 = 64 / 2
    num_key_value_heads=1,
    max_position_embeddings=128,
)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
               "rope_theta": 500000.0}  # fmt: skip
YARN_ROPE = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
             "rope_theta": 10000.0}  # fmt: skip
# Prompts of different lengths (ids below VOCAB), decoded together as one batch.
PROMPTS = [[5, 17, 42], [7], [200, 13, 99, 150, 3, 77, 250], [31, 31], [120, 8, 64, 9, 11]]


@dataclass(frozen=True)
class Case:
    """One tiny model: its transformers config class and the keyword arguments it gets."""

    name: str
    config_class: str
    tied: bool
    extra: dict[str, Any] = field(default_factory=dict)


CASES = [
    Case("qwen2-tied", "Qwen2Config", True),
    Case("qwen2-untied", "Qwen2Config", False, {"rope_theta": 5000.0}),
    Case("llama-llama3-rope", "LlamaConfig", False, {"rope_parameters": LLAMA3_ROPE}),
    Case("llama-linear-rope-tied", "LlamaConfig", True,
         {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}),
    Case("qwen3-tied", "Qwen3Config", True, {"head_dim": 32}),
    # head_dim 32 with 4 heads: q/k/v/o project to 128, not hidden_size 64.
    Case("qwen3-wide-heads", "Qwen3Config", False,
         {"head_dim": 32, "num_attention_heads": 4, "num_key_value_heads": 2}),
    # 8 experts, 2 per token, renormalised; layer 1 of 3 keeps a dense MLP.
    Case("qwen3-moe", "Qwen3MoeConfig", False,
         {"head_dim": 32, "num_hidden_layers": 3, "num_experts": 8, "num_experts_per_tok": 2,
          "moe_intermediate_size": 48, "norm_topk_prob": True, "mlp_only_layers": [1]}),
]  # fmt: skip
MOE = CASES[6]
# (appended, so the indices above stay) Mistral as Small 3 ships it: an explicit head_dim, no
# window; Qwen3 with YaRN as Qwen's long-context recipe sets it (factor 4 over the original).
CASES += [
    Case("mistral-head-dim", "MistralConfig", False,
         {"head_dim": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
          "sliding_window": None}),
    Case("qwen3-yarn", "Qwen3Config", True,
         {"head_dim": 32, "rope_parameters": YARN_ROPE}),
    # OLMo-2: post-norm layers, q/k normalised over whole projections; 4 heads on 2 kv heads
    Case("olmo2", "Olmo2Config", False,
         {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128}),
    # Sliding windows narrower than the prompts and the 16 decoded tokens, so they bind:
    # Mistral v0.1's kind (every layer), Qwen2's (use_sliding_window, layers from
    # max_window_layers on), OLMo-3's (three of four layers, YaRN on the full one only)
    Case("mistral-window", "MistralConfig", True, {"head_dim": 32, "sliding_window": 4}),
    Case("qwen2-window", "Qwen2Config", False,
         {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1}),
    Case("olmo3", "Olmo3Config", False,
         {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128,
          "num_hidden_layers": 4, "sliding_window": 6,
          "rope_parameters": {"full_attention": YARN_ROPE,
                              "sliding_attention": {"rope_type": "default",
                                                    "rope_theta": 10000.0}}}),
]  # fmt: skip
MISTRAL, YARN, OLMO2 = CASES[7], CASES[8], CASES[9]
MISTRAL_WINDOW, QWEN2_WINDOW, OLMO3 = CASES[10], CASES[11], CASES[12]
# Gemma 3's text model: sandwich norms by 1 + weight, sqrt(hidden) embeddings, tanh-GELU, a
# query_pre_attn_scalar that is not head_dim, five sliding layers (window 5) of six, plain
# RoPE at 10000 on them and linear-scaled RoPE at 1e6 on the full one (as its 4B+ ship)
CASES += [
    Case("gemma3-text", "Gemma3TextConfig", True,
         {"num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 32, "query_pre_attn_scalar": 24, "sliding_window": 5,
          "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                 "rope_theta": 1e6},
                              "sliding_attention": {"rope_type": "default",
                                                    "rope_theta": 10000.0}}}),
]  # fmt: skip
GEMMA3 = CASES[13]
# Phi-3/Phi-4: fused qkv_proj and gate_up_proj in the file. Phi-3-mini-4k's kind of window on
# every layer (binding here), untied; Phi-4's shape (4 heads on 2 kv heads), tied as Phi-4-mini
# is. Token ids inside the tiny vocab (Phi3Config's default pad id is 32000).
PHI3_IDS: dict[str, Any] = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
CASES += [
    Case("phi3-window", "Phi3Config", False, {**PHI3_IDS, "sliding_window": 4}),
    Case("phi3-gqa-tied", "Phi3Config", True,
         {**PHI3_IDS, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128,
          "rope_parameters": {"rope_type": "default", "rope_theta": 250000.0}}),
]  # fmt: skip
PHI3_WINDOW, PHI3 = CASES[14], CASES[15]
# Phi-4-mini's kind: 3/4 of each head rotates (24 of 32 dimensions), LongRoPE with its short
# factors within an original context of 64 (128 positions: factor 2, attention factor
# sqrt(1 + ln 2 / ln 64)); the long factors are for longer sequences, which pivotflow refuses
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.25 * i for i in range(12)],
            "long_factor": [2.0 + 0.5 * i for i in range(12)],
            "original_max_position_embeddings": 64}  # fmt: skip
CASES += [
    Case("phi4-mini-longrope", "Phi3Config", True,
         {**PHI3_IDS, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128,
          "partial_rotary_factor": 0.75, "original_max_position_embeddings": 64,
          "rope_parameters": LONGROPE}),
]  # fmt: skip
PHI4_MINI = CASES[16]
# Mixtral: Mistral's attention (its window on every layer, binding here) and a sparse layer on
# every layer, 4 experts of intermediate_size, 2 a token, renormalised; named block_sparse_moe
# and w1/w2/w3 in the file
CASES += [
    Case("mixtral-window", "MixtralConfig", False,
         {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 5}),
]  # fmt: skip
MIXTRAL = CASES[17]
# GLM-4 (GLM-4-9B-0414's kind): gate/up fused, a norm after each sub-layer, q/k/v biases, half
# of each head turning in interleaved pairs
CASES += [
    Case("glm4", "Glm4Config", False,
         {"head_dim": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128,
          "pad_token_id": 0, "eos_token_id": 2}),
]  # fmt: skip
GLM4 = CASES[18]
# GLM-4.5 (glm4_moe; GLM-4.5-Air's kind): its first layer dense, the others 8 experts (2 a
# token) in 2 groups of which a token's experts come from the best 1, a sigmoid router with a
# correction bias, weights renormalised and scaled by 2.5, one shared expert; q/k/v biases,
# half of each head turning (in halves, as Llama's)
CASES += [
    Case("glm4-moe", "Glm4MoeConfig", False,
         {"head_dim": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128,
          "num_hidden_layers": 3, "n_routed_experts": 8, "num_experts_per_tok": 2,
          "moe_intermediate_size": 48, "n_shared_experts": 1, "n_group": 2, "topk_group": 1,
          "routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "attention_bias": True,
          "pad_token_id": 0, "eos_token_id": 2}),
]  # fmt: skip
GLM4_MOE = CASES[19]
# SmolLM3: Llama's layer, every second layer here a NoPE layer (SmolLM3-3B: every fourth),
# tied; and with use_sliding_window, its NoPE layers within a window (binding here)
SMOLLM3_IDS: dict[str, Any] = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
CASES += [
    Case("smollm3", "SmolLM3Config", True,
         {**SMOLLM3_IDS, "num_hidden_layers": 4, "no_rope_layer_interval": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128}),
    Case("smollm3-window", "SmolLM3Config", False,
         {**SMOLLM3_IDS, "num_hidden_layers": 4, "use_sliding_window": True,
          "sliding_window": 5, "no_rope_layers": [1, 0, 1, 0],
          "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}}),
]  # fmt: skip
SMOLLM3, SMOLLM3_WINDOW = CASES[20], CASES[21]
# Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): 8 experts (2 a token, not renormalised) and a
# shared expert scaled by a sigmoid gate, layer 1 of 3 dense; q/k/v biases; its window on
# layer 0 (every other layer below max_window_layers), binding here
CASES += [
    Case("qwen2-moe-window", "Qwen2MoeConfig", False,
         {"num_hidden_layers": 3, "num_experts": 8, "num_experts_per_tok": 2,
          "moe_intermediate_size": 48, "shared_expert_intermediate_size": 96,
          "mlp_only_layers": [1], "use_sliding_window": True, "sliding_window": 5,
          "max_window_layers": 2}),
]  # fmt: skip
QWEN2_MOE = CASES[22]
# Gemma 2 (2B/9B/27B, and reward models such as Skywork-Reward-Gemma-2-27B): Gemma 3's layer
# without q/k norms, attention scores soft-capped at 50 and logits at 30 (here 5 and 3, so
# the caps bind), a window on every other layer (binding here), one rope for all
CASES += [
    Case("gemma2-window", "Gemma2Config", True,
         {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 32, "query_pre_attn_scalar": 24, "sliding_window": 5,
          "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0}),
]  # fmt: skip
GEMMA2 = CASES[23]
# OLMoE (OLMoE-1B-7B): Llama's pre-norm layer with q and k normalised over their whole
# projections (OLMo-2's norms), 8 experts of intermediate_size on every layer, 2 a token, not
# renormalised
CASES += [
    Case("olmoe", "OlmoeConfig", False,
         {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128,
          "num_experts": 8, "num_experts_per_tok": 2, "pad_token_id": 0, "eos_token_id": 2}),
]  # fmt: skip
OLMOE = CASES[24]
# Granite (IBM Granite 3.x): Llama's layer with its four multipliers, none of them 1
# (granite-3.3-8b's kind: embeddings x12, sub-layer outputs x0.22, scores x1/128 of a head's,
# logits / 16; here scaled to the tiny model)
CASES += [
    Case("granite", "GraniteConfig", False,
         {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128,
          "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
          "attention_multiplier": 0.0625, "logits_scaling": 4.0, "pad_token_id": 0,
          "eos_token_id": 2, "bos_token_id": 1}),
]  # fmt: skip
GRANITE = CASES[25]
# gpt-oss (gpt-oss-20b's kind, unquantized): attention sinks, q/k/v/o biases, every other
# layer within a window (binding here), YaRN as it ships it (truncate false), 4 experts on every
# layer (2 a token, a softmax over the chosen logits of a biased router), biased experts with
# the clamped gate, fused in the file
CASES += [
    Case("gpt-oss", "GptOssConfig", False,
         {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128,
          "head_dim": 32, "intermediate_size": 64, "num_local_experts": 4,
          "num_experts_per_tok": 2, "sliding_window": 4, "pad_token_id": 0, "eos_token_id": 2,
          "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                              "beta_slow": 1.0, "truncate": False,
                              "original_max_position_embeddings": 32, "rope_theta": 150000.0}}),
]  # fmt: skip
GPT_OSS = CASES[26]
# DeepSeek-V3 (DeepSeek-V3/R1, Moonlight, Kimi K2's kind): latent attention (queries through a
# latent, keys and values from one, values narrower than keys, the rotary part in interleaved
# pairs), YaRN with DeepSeek's mscale terms (the score scale's binding here), its first layer
# dense, the others GLM-4.5's experts; and without a query latent (Moonlight's, DeepSeek-V2-
# Lite's kind), rotary halves, plain rope, tied
DEEPSEEK_MOE: dict[str, Any] = {
    "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
    "num_hidden_layers": 3, "n_routed_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 48, "n_shared_experts": 1, "n_group": 2, "topk_group": 1,
    "routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "pad_token_id": 0,
    "eos_token_id": 2, "bos_token_id": 1}
CASES += [
    Case("deepseek-v3", "DeepseekV3Config", False,
         {**DEEPSEEK_MOE, "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 32,
          "qk_rope_head_dim": 16, "v_head_dim": 24,
          "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0,
                              "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0,
                              "original_max_position_embeddings": 32, "rope_theta": 10000.0}}),
    Case("deepseek-v3-no-q-latent", "DeepseekV3Config", True,
         {**DEEPSEEK_MOE, "q_lora_rank": None, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
          "qk_rope_head_dim": 16, "v_head_dim": 32, "rope_interleave": False}),
]  # fmt: skip
DEEPSEEK_V3, DEEPSEEK_V3_PLAIN = CASES[27], CASES[28]
# DeepSeek-V2: the same latent attention (rotary pairs always interleaved), a softmax router
# whose weights are not renormalised, times 16 as DeepSeek-V2's: from the 2 of 4 groups whose
# best expert scores highest (group_limited_greedy, DeepSeek-V2's); and from all experts
# ("greedy") with no query latent and DeepSeek-V2-Lite's YaRN (mscale 0.707 on both terms)
CASES += [
    Case("deepseek-v2", "DeepseekV2Config", False,
         {**DEEPSEEK_MOE, "n_group": 4, "topk_group": 2, "topk_method": "group_limited_greedy",
          "routed_scaling_factor": 16.0, "n_shared_experts": 2, "q_lora_rank": 48,
          "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 24}),
    Case("deepseek-v2-lite", "DeepseekV2Config", False,
         {**DEEPSEEK_MOE, "n_group": 1, "topk_group": 1, "topk_method": "greedy",
          "routed_scaling_factor": 1.0, "q_lora_rank": None, "kv_lora_rank": 32,
          "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 32,
          "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "mscale": 0.707,
                              "mscale_all_dim": 0.707, "beta_fast": 32.0, "beta_slow": 1.0,
                              "original_max_position_embeddings": 32, "rope_theta": 10000.0}}),
]  # fmt: skip
DEEPSEEK_V2, DEEPSEEK_V2_LITE = CASES[29], CASES[30]
# Qwen3.5: gated DeltaNet on three of every four layers (two value heads per key head), gated
# full attention with zero-centred q/k norms and a quarter of each head rotating on the fourth;
# and with the layer types named, a full layer first, tied
QWEN3_5_LINEAR: dict[str, Any] = {
    "head_dim": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 24, "linear_conv_kernel_dim": 4}
CASES += [
    Case("qwen3.5", "Qwen3_5TextConfig", False, {**QWEN3_5_LINEAR, "num_hidden_layers": 4}),
    Case("qwen3.5-full-first-tied", "Qwen3_5TextConfig", True,
         {**QWEN3_5_LINEAR, "num_hidden_layers": 3,
          "layer_types": ["full_attention", "linear_attention", "linear_attention"]}),
]  # fmt: skip
QWEN3_5, QWEN3_5_TIED = CASES[31], CASES[32]
# Qwen3.5-MoE: the same hybrid, every layer's MLP 8 experts (2 a token, renormalised) and a
# shared expert behind a sigmoid gate
CASES += [
    Case("qwen3.5-moe", "Qwen3_5MoeTextConfig", False,
         {**QWEN3_5_LINEAR, "num_hidden_layers": 4, "num_experts": 8, "num_experts_per_tok": 2,
          "moe_intermediate_size": 48, "shared_expert_intermediate_size": 96}),
]  # fmt: skip
QWEN3_5_MOE = CASES[33]
# Qwen3-Next: the same hybrid, its DeltaNet projections fused and grouped by key head in the
# file (in_proj_qkvz, in_proj_ba), experts on layers 1 and 3 (decoder_sparse_step 2) but 3
# (mlp_only_layers), the others dense
CASES += [
    Case("qwen3-next", "Qwen3NextConfig", False,
         {**QWEN3_5_LINEAR, "num_hidden_layers": 4, "num_experts": 8, "num_experts_per_tok": 2,
          "moe_intermediate_size": 48, "shared_expert_intermediate_size": 96,
          "decoder_sparse_step": 2, "mlp_only_layers": [3]}),
]  # fmt: skip
QWEN3_NEXT = CASES[34]
# Granite 4.0: Granite 4.0-H's kind (Mamba2 on three of four layers: 8 heads of 16, 2 groups of
# state 16; attention without rope; 8 experts, 2 a token, beside a shared MLP; Granite's
# multipliers), Granite 4.0-H-Micro's (dense, rope, tied) and the dense Granite 4.0's (every
# layer attention, rope)
GRANITE4_MAMBA: dict[str, Any] = {
    "mamba_n_heads": 8, "mamba_d_head": 16,
    "mamba_n_groups": 2, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
    "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.03,
    "logits_scaling": 6.0, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
CASES += [
    Case("granite-4.0-h", "GraniteMoeHybridConfig", False,
         {**GRANITE4_MAMBA, "num_hidden_layers": 4,
          "layer_types": ["mamba", "mamba", "attention", "mamba"], "num_local_experts": 8,
          "num_experts_per_tok": 2, "intermediate_size": 48, "shared_intermediate_size": 96,
          "position_embedding_type": "nope"}),
    Case("granite-4.0-h-dense-rope-tied", "GraniteMoeHybridConfig", True,
         {**GRANITE4_MAMBA, "num_hidden_layers": 3, "layer_types": ["mamba", "attention", "mamba"],
          "num_local_experts": 0, "shared_intermediate_size": 96,
          "position_embedding_type": "rope"}),
    Case("granite-4.0-dense", "GraniteMoeHybridConfig", False,
         {**GRANITE4_MAMBA, "layer_types": ["attention", "attention"], "num_local_experts": 0,
          "shared_intermediate_size": 96, "position_embedding_type": "rope"}),
]  # fmt: skip
GRANITE4_H, GRANITE4_H_DENSE, GRANITE4_DENSE = CASES[35], CASES[36], CASES[37]
# Nemotron-H: one block a layer, Mamba2 (4 heads of 32, 2 groups of state 16), ungated relu^2
# MLPs and attention without rope, in the Hub's pattern's kind of order, and attention first
# (untied: transformers' NemotronH never ties its head)
NEMOTRON_MAMBA: dict[str, Any] = {"head_dim": 32, "mamba_num_heads": 4, "mamba_head_dim": 32,
                                  "n_groups": 2, "ssm_state_size": 16, "intermediate_size": 96}
CASES += [
    Case("nemotron-h", "NemotronHConfig", False,
         {**NEMOTRON_MAMBA, "hybrid_override_pattern": "M-M*-M-"}),
    Case("nemotron-h-attention-first", "NemotronHConfig", False,
         {**NEMOTRON_MAMBA, "hybrid_override_pattern": "*-M-"}),
]  # fmt: skip
NEMOTRON_H, NEMOTRON_H_ATTENTION_FIRST = CASES[38], CASES[39]
# Nemotron 3's: its MLPs mixtures of 8 ungated experts (2 a token) beside a shared one, chosen by
# a grouped sigmoid router (the best 1 of 2 groups) with a correction bias, weights
# renormalised times 2.5; a dense MLP block among them
CASES += [
    Case("nemotron-h-moe", "NemotronHConfig", False,
         {**NEMOTRON_MAMBA, "hybrid_override_pattern": "ME*-ME", "n_routed_experts": 8,
          "num_experts_per_tok": 2, "moe_intermediate_size": 48,
          "moe_shared_expert_intermediate_size": 64, "n_group": 2, "topk_group": 1,
          "routed_scaling_factor": 2.5, "norm_topk_prob": True}),
]  # fmt: skip
NEMOTRON_H_MOE = CASES[40]
# MiniMax-M2: q and k normalised over their whole projections, the first 16 of each head's 32
# dimensions rotating (its legacy rotary_dim), 8 experts on every layer chosen by a sigmoid
# router with a correction bias (2 a token, renormalised); Mixtral's names in the file
CASES += [
    Case("minimax-m2", "MiniMaxM2Config", False,
         {"head_dim": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "rotary_dim": 16,
          "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 48,
          "bos_token_id": 1, "eos_token_id": 2, "rope_theta": 10000.0}),
]  # fmt: skip
MINIMAX_M2 = CASES[41]
# OLMo Hybrid: Qwen3.5's DeltaNet widths (two value heads per key head) writing at up to twice
# the rate, in Llama's pre-norm layer, OLMo-3's post-norm attention (whole-projection q/k norms)
# on every fourth layer; without rope (the released checkpoints' null rope_theta) and with it
OLMO_HYBRID_LINEAR: dict[str, Any] = {
    key: QWEN3_5_LINEAR[key] for key in ("linear_num_key_heads", "linear_num_value_heads",
                                         "linear_key_head_dim", "linear_value_head_dim")}
CASES += [
    Case("olmo-hybrid", "OlmoHybridConfig", False,
         {**OLMO_HYBRID_LINEAR, "num_hidden_layers": 4, "pad_token_id": 0, "eos_token_id": 1,
          "rope_parameters": {"rope_type": "default", "rope_theta": None}}),
    Case("olmo-hybrid-rope", "OlmoHybridConfig", False,
         {**OLMO_HYBRID_LINEAR, "num_hidden_layers": 4, "pad_token_id": 0, "eos_token_id": 1,
          "layer_types": ["full_attention", "linear_attention", "linear_attention",
                          "full_attention"]}),
]  # fmt: skip
OLMO_HYBRID, OLMO_HYBRID_ROPE = CASES[42], CASES[43]
# EXAONE 4.0: OLMo-2's post-norm layer with q and k normalised per head; 32B's kind (three
# sliding layers of four, a window of 4 that binds, its full layers turning no position) and
# 1.2B's (no window, every layer full and turning)
CASES += [
    Case("exaone4", "Exaone4Config", False,
         {"num_hidden_layers": 4, "sliding_window": 4, "sliding_window_pattern": 4,
          "num_key_value_heads": 1, "bos_token_id": 1, "eos_token_id": 2}),
    Case("exaone4-no-window", "Exaone4Config", True,
         {"num_hidden_layers": 2, "sliding_window": None,
          "layer_types": ["full_attention", "full_attention"], "bos_token_id": 1,
          "eos_token_id": 2}),
]  # fmt: skip
EXAONE4, EXAONE4_NO_WINDOW = CASES[44], CASES[45]
# ERNIE 4.5 (0.3B's kind): Llama's layer, each head's rotary pairs interleaved (held turned, as
# GLM-4's), tied
CASES += [
    Case("ernie4.5", "Ernie4_5Config", True,
         {"head_dim": 32, "num_key_value_heads": 1, "bos_token_id": 1, "eos_token_id": 2}),
]  # fmt: skip
ERNIE4_5 = CASES[46]
# LFM2: gated short convolutions (3 taps) on two layers of three, attention with per-head q/k
# norms on the other; its MLP's width derived from intermediate_size (2/3, rounded up to 32)
CASES += [
    Case("lfm2", "Lfm2Config", True,
         {"num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"],
          "intermediate_size": 144, "block_multiple_of": 32, "bos_token_id": 1,
          "eos_token_id": 2}),
]  # fmt: skip
LFM2 = CASES[47]
# Seed-OSS (36B's kind): Llama's layer with q/k/v biases and none on o_proj; its dropout (0.1 in
# its config) off, as in every RL trainer's forward here
CASES += [
    Case("seed-oss", "SeedOssConfig", False,
         {"head_dim": 32, "num_key_value_heads": 1, "attention_dropout": 0.1,
          "residual_dropout": 0.1, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
]  # fmt: skip
SEED_OSS = CASES[48]
# Hunyuan dense (7B's kind): Llama's layer with q and k normalised per head after rope; its
# rope NTK-stretched by a fixed alpha (as its configs say it: "dynamic" with an alpha), tied
CASES += [
    Case("hunyuan-dense", "HunYuanDenseV1Config", True,
         {"head_dim": 32, "num_key_value_heads": 1, "bos_token_id": 1, "eos_token_id": 2,
          "rope_parameters": {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0,
                              "rope_theta": 10000.0}}),
]  # fmt: skip
HUNYUAN = CASES[49]
# Hunyuan-MoE (A13B's kind): that attention, and on every layer a shared MLP beside 4 experts
# as wide, the top 2 a token (the Hub's per-layer list), untied
CASES += [
    Case("hunyuan-moe", "HunYuanMoEV1Config", False,
         {"head_dim": 32, "num_key_value_heads": 1, "num_experts": 4, "moe_topk": [2, 2],
          "intermediate_size": 96, "bos_token_id": 1, "eos_token_id": 2,
          "rope_parameters": {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0,
                              "rope_theta": 10000.0}}),
]  # fmt: skip
HUNYUAN_MOE = CASES[50]
# ERNIE 4.5 MoE (21B-A3B's kind): its interleaved rotary pairs, a dense first layer then 4
# experts (2 a token, one shared) chosen by softmax plus a correction bias, tied
CASES += [
    Case("ernie4.5-moe", "Ernie4_5_MoeConfig", True,
         {"head_dim": 32, "num_key_value_heads": 1, "num_hidden_layers": 3,
          "moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 48,
          "moe_num_shared_experts": 1, "moe_layer_start_index": 1, "bos_token_id": 1,
          "eos_token_id": 2}),
]  # fmt: skip
ERNIE4_5_MOE = CASES[51]
# Ministral 3: Mistral's layer, YaRN from an original context of 8 (so the test's positions pass
# it), and past it queries scaled by 1 + 0.1 log(1 + floor(p / 8)) after rope
MINISTRAL3_ROPE = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                   "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0,
                   "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}
CASES += [
    Case("ministral3", "Ministral3Config", False,
         {"head_dim": 32, "rope_parameters": MINISTRAL3_ROPE, "pad_token_id": 0,
          "bos_token_id": 1, "eos_token_id": 2}),
]  # fmt: skip
MINISTRAL3 = CASES[52]
# GLM-4.7-Flash's kind (glm4_moe_lite): DeepSeek-V3's latent attention in GLM-4.5's layer, its
# dense and sparse layers said per layer (mlp_layer_types)
CASES += [
    Case("glm4.7-flash", "Glm4MoeLiteConfig", False,
         {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
          "num_hidden_layers": 3, "mlp_layer_types": ["dense", "sparse", "sparse"],
          "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
          "n_shared_experts": 1, "routed_scaling_factor": 1.8, "q_lora_rank": 48,
          "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
          "v_head_dim": 24, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
]  # fmt: skip
GLM4_7_FLASH = CASES[53]
# LFM2-MoE (8B-A1B's kind): LFM2's layers, a dense first MLP, then 4 experts (2 a token) by a
# sigmoid router choosing with a bias on the block, weights times 1.5
CASES += [
    Case("lfm2-moe", "Lfm2MoeConfig", True,
         {"num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"],
          "intermediate_size": 96, "moe_intermediate_size": 32, "num_dense_layers": 1,
          "num_experts": 4, "num_experts_per_tok": 2, "routed_scaling_factor": 1.5,
          "bos_token_id": 1, "eos_token_id": 2}),
]  # fmt: skip
LFM2_MOE = CASES[54]
# dots.llm1: Qwen3's attention in DeepSeek-V3's layer (a dense first MLP, then 4 experts by a
# sigmoid router with a bias, unrenormalised, times 2, one shared), its layers from
# max_window_layers on within a window of 4 that binds
CASES += [
    Case("dots1", "Dots1Config", False,
         {"num_hidden_layers": 3, "n_routed_experts": 4, "num_experts_per_tok": 2,
          "n_shared_experts": 1, "moe_intermediate_size": 32, "first_k_dense_replace": 1,
          "routed_scaling_factor": 2.0, "sliding_window": 4, "max_window_layers": 1,
          "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
]  # fmt: skip
DOTS1 = CASES[55]
# Mistral 4: DeepSeek-V3's layer with a softmax router (the best of 2 groups, ranked by their
# two best: group ranking binds), no correction bias, times 1.5; YaRN from 8 positions with
# Llama 4's query scaling past them, on the whole query; its config's head_dim the query's width
# and its rope's rotary share (16 of 48) said as transformers writes them
CASES += [
    Case("mistral4", "Mistral4Config", False,
         {**DEEPSEEK_MOE, "routed_scaling_factor": 1.5, "q_lora_rank": 48, "kv_lora_rank": 32,
          "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 24,
          "rope_parameters": {**MINISTRAL3_ROPE, "rope_theta": 10000.0,
                              "partial_rotary_factor": 16 / 48}}),
]  # fmt: skip
MISTRAL4 = CASES[56]
# Solar Open: Llama's attention (q/k/v biased, o_proj not) in GLM-4.5's sparse layer on every
# layer (4 experts, 2 a token, from the best of 2 groups by a sigmoid router with a bias, one
# shared, times 2); Arcee (AFM-4.5B): Llama's layer with an ungated relu(x)^2 MLP, YaRN
CASES += [
    Case("solar-open", "SolarOpenConfig", False,
         {"head_dim": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
          "moe_intermediate_size": 32, "n_group": 2, "topk_group": 1,
          "routed_scaling_factor": 2.0, "attention_bias": True, "pad_token_id": 0,
          "bos_token_id": 1, "eos_token_id": 2}),
    Case("arcee", "ArceeConfig", False,
         {"head_dim": 32, "rope_parameters": YARN_ROPE, "pad_token_id": 0, "bos_token_id": 1,
          "eos_token_id": 2}),
]  # fmt: skip
SOLAR_OPEN, ARCEE = CASES[57], CASES[58]
# AFMoE (Arcee Trinity): Gemma's sandwich layer, attention with per-head q/k norms and a
# sigmoid output gate of its own projection, rope on the sliding layers only (a window of 4 on
# every other layer, binding), a dense first MLP, then 4 experts (2 a token) by a sigmoid
# router with a bias on the block, renormalised, times 1.5, beside a shared one; mup's
# embedding scale
CASES += [
    Case("afmoe", "AfmoeConfig", False,
         {"num_hidden_layers": 4, "head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2,
          "num_shared_experts": 1, "moe_intermediate_size": 32, "num_dense_layers": 1,
          "route_scale": 1.5, "global_attn_every_n_layers": 2, "sliding_window": 4,
          "mup_enabled": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
]  # fmt: skip
AFMOE = CASES[59]
# Apertus: Llama's layer with per-head q/k norms, its own norm names, an ungated MLP through
# xIELU (two learned scalars a layer, random here), Llama 3's rope binding past 16 positions
CASES += [
    Case("apertus", "ApertusConfig", False,
         {"head_dim": 32, "rope_parameters": LLAMA3_ROPE, "pad_token_id": 0, "bos_token_id": 1,
          "eos_token_id": 2}),
]  # fmt: skip
APERTUS = CASES[60]
# HY V3: per-head q/k norms before rope, a dense first layer, then 4 experts (2 a token) by a
# sigmoid router with a bias on the block, renormalised, times 2, beside a shared one; its
# router, bias and shared MLP under its own names in the file
CASES += [
    Case("hy-v3", "HYV3Config", False,
         {"num_hidden_layers": 3, "head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2,
          "num_shared_experts": 1, "moe_intermediate_size": 32, "router_scaling_factor": 2.0,
          "mlp_layer_types": ["dense", "sparse", "sparse"], "pad_token_id": 0,
          "bos_token_id": 1, "eos_token_id": 2}),
]  # fmt: skip
HY_V3 = CASES[61]
# Granite SWA: Granite's multipliers, a learned sink per head, a window of 4 on all but every
# fourth layer (binding), a base per layer: the full layers NoPE, the sliding ones at 1e4 and,
# without NoPE, full layers at 5e5 (two bases)
_GRANITE_SWA = {"num_hidden_layers": 4, "head_dim": 32, "sliding_window": 4,
                "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                "attention_multiplier": 0.03, "logits_scaling": 6.0, "pad_token_id": 0,
                "bos_token_id": 1, "eos_token_id": 2}
CASES += [
    Case("granite-swa", "GraniteSWAConfig", True,
         {**_GRANITE_SWA, "layer_rope_theta": [0, 10000.0, 10000.0, 10000.0]}),
    Case("granite-swa-two-bases", "GraniteSWAConfig", False,
         {**_GRANITE_SWA, "layer_rope_theta": [500000.0, 10000.0, 10000.0, 10000.0]}),
]  # fmt: skip
GRANITE_SWA, GRANITE_SWA_TWO_BASES = CASES[62], CASES[63]
# MiniCPM5-MoE: Llama's attention gated by a sigmoid (q and gate by head in q_proj, as
# Qwen3.5's), a dense first layer, then 8 experts (2 a token) by a sigmoid router with a bias,
# from the best of 2 groups, renormalised, times 2, beside a shared one
CASES += [
    Case("minicpm5-moe", "MiniCPM5MoeConfig", False,
         {"num_hidden_layers": 3, "head_dim": 32, "n_routed_experts": 8,
          "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_group": 2, "topk_group": 1,
          "routed_scaling_factor": 2.0, "mlp_layer_types": ["dense", "sparse", "sparse"],
          "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
]  # fmt: skip
MINICPM5_MOE = CASES[64]
# Gemma 4 (gemma-4-31B's kind): full layers (the second and fourth) with heads twice as wide
# on one key/value head, their values their keys' (attention_k_eq_v), a quarter of their
# frequencies turning (proportional rope); sliding ones (a window of 4, binding) on two; logits
# soft-capped; each layer's output scalar random. And without values equal to keys: the full
# layers' v_proj and key/value heads as the sliding ones', the default layer pattern (the last
# layer full)
_GEMMA4 = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 32, "global_head_dim": 64, "sliding_window": 4,
           "hidden_size_per_layer_input": 0, "pad_token_id": 0, "bos_token_id": 2,
           "eos_token_id": 1}
CASES += [
    Case("gemma4", "Gemma4TextConfig", True,
         {**_GEMMA4, "num_global_key_value_heads": 1, "attention_k_eq_v": True,
          "final_logit_softcapping": 30.0,
          "layer_types": ["sliding_attention", "full_attention"] * 2}),
    Case("gemma4-values-apart", "Gemma4TextConfig", False, {**_GEMMA4}),
]  # fmt: skip
GEMMA4, GEMMA4_VALUES_APART = CASES[65], CASES[66]
# Gemma 4 E2B's and E4B's kind: per-layer inputs of 16 a layer, the last two layers attending
# over the keys and values of the last earlier layer of their type (the second, the third),
# their MLPs twice as wide
CASES += [
    Case("gemma4-e2b", "Gemma4TextConfig", True,
         {**_GEMMA4, "num_hidden_layers": 5, "hidden_size_per_layer_input": 16,
          "vocab_size_per_layer_input": VOCAB, "num_kv_shared_layers": 2,
          "use_double_wide_mlp": True,
          "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                          "sliding_attention", "full_attention"]}),
]  # fmt: skip
GEMMA4_E2B = CASES[67]
# gemma-4-26B-A4B's kind: the first case's layers with 4 experts (2 a token) beside each MLP,
# its router's scales random
CASES += [
    Case("gemma4-moe", "Gemma4TextConfig", True,
         {**GEMMA4.extra, "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2,
          "moe_intermediate_size": 32}),
]  # fmt: skip
GEMMA4_MOE = CASES[68]
# Granite 3's MoE (granite-3.1-3b-a800m's kind): Granite's multipliers, on every layer 4 experts
# (2 a token) by a softmax over the top 2 logits, stacked in the file (gate/up fused); and
# granitemoeshared's, with a shared MLP beside them
_GRANITE_MOE = {"head_dim": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
                "intermediate_size": 48, "embedding_multiplier": 12.0,
                "residual_multiplier": 0.22, "attention_multiplier": 0.03, "logits_scaling": 6.0}
CASES += [
    Case("granite-3-moe", "GraniteMoeConfig", True, _GRANITE_MOE),
    Case("granite-moe-shared", "GraniteMoeSharedConfig", False,
         {**_GRANITE_MOE, "shared_intermediate_size": 64}),
]  # fmt: skip
GRANITE_MOE, GRANITE_MOE_SHARED = CASES[69], CASES[70]
# Cohere 2 (Command R7B's kind): parallel layers with LayerNorms, rope in interleaved pairs on
# its three sliding layers of four (a window of 4, binding), the fourth turning no position;
# logits times 0.25
CASES += [
    Case("cohere2", "Cohere2Config", True,
         {"num_hidden_layers": 4, "sliding_window": 4, "logit_scale": 0.25,
          "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
]  # fmt: skip
COHERE2 = CASES[71]
# Command R (Cohere 1): the same layer, rope on every layer, no window
CASES += [
    Case("cohere", "CohereConfig", True,
         {"logit_scale": 0.25, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
]  # fmt: skip
COHERE = CASES[72]
# Llama 4 (Scout's kind): its rope layers (three of four) attend within chunks of 8 positions
# (binding), turn interleaved pairs and normalise q and k without weights; the fourth turns
# no position, attends to all, its queries' temperature binding from position 3 (floor_scale
# 4); every other layer routes each token to 1 of 4 experts by a sigmoid, the expert reading
# the token times its weight, beside a shared expert; llama3 rope with Scout's equal low and
# high frequency factors
CASES += [
    Case("llama4", "Llama4TextConfig", False,
         {"num_hidden_layers": 4, "head_dim": 32, "intermediate_size": 48,
          "intermediate_size_mlp": 96, "num_local_experts": 4, "num_experts_per_tok": 1,
          "interleave_moe_layer_step": 2, "attention_chunk_size": 8, "floor_scale": 4,
          "attn_scale": 0.5, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
          "rope_parameters": {**LLAMA3_ROPE, "high_freq_factor": 1.0}}),
]  # fmt: skip
LLAMA4 = CASES[73]
# Command R+: Command R's layer with LayerNorms of q and k per head, each head's weight its
# own (2 query heads on 1 key/value head)
CASES += [
    Case("cohere-plus", "CohereConfig", True,
         {"logit_scale": 0.25, "use_qk_norm": True, "pad_token_id": 0, "bos_token_id": 1,
          "eos_token_id": 2}),
]  # fmt: skip
COHERE_PLUS = CASES[74]
CASE_IDS = [c.name for c in CASES]


def hf_model(case: Case, seed: int = 0):  # type: ignore[no-untyped-def]
    """The transformers model for ``case``, with weights sharper than HF's init (so greedy
    paths are not decided by near-ties) and random norm weights and biases (so a missing q/k
    norm or bias shows)."""
    transformers = pytest.importorskip("transformers")
    config = getattr(transformers, case.config_class)(
        **{**SIZES, **case.extra}, tie_word_embeddings=case.tied
    )
    torch.manual_seed(seed)
    own = _UNMAPPED.get(case.config_class)  # (a class of its own: built from the config)
    model = (getattr(transformers, own)(config) if own
             else transformers.AutoModelForCausalLM.from_config(config)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:  # matrices, and transformers 5's fused [experts, out, in] stacks
                p.normal_(0.0, 0.15)
            elif name.endswith(("norm.weight", "router.scale", "per_expert_scale")):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:  # biases
                p.normal_(0.0, 0.1)
        for name, b in model.named_buffers():  # GLM-4.5's router bias: held as a buffer there
            if name.endswith(("e_score_correction_bias", "expert_bias")):  # (LFM2-MoE's)
                b.normal_(0.0, 0.1)
            if name.endswith("layer_scalar"):  # (Gemma 4's: a constant of the checkpoint)
                b.copy_(1.0 + 0.2 * torch.randn_like(b))
    # The greedy reference decodes a fixed number of tokens: no eos, no suppression.
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


# the configs transformers' auto classes map to no causal LM (Mistral 4's: the Hub holds it
# inside Mistral3ForConditionalGeneration), and their causal LM's class
_UNMAPPED = {"Mistral4Config": "Mistral4ForCausalLM"}


def sharpened(model: Any) -> Any:
    """``model`` (a transformers model, in eval mode) with its matrices drawn wider than HF's
    init, so greedy paths and scores are not decided by near-ties."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.15)
    return model.eval()


def causal_lm_class(config: Any) -> Any:
    """The transformers class that builds (``from_config``) or loads (``from_pretrained``)
    ``config``'s causal LM: AutoModelForCausalLM, or its own where the auto class has none."""
    transformers = pytest.importorskip("transformers")
    own = _UNMAPPED.get(type(config).__name__)
    return getattr(transformers, own) if own else transformers.AutoModelForCausalLM


def save_folder(case: Case, root: Path, **save_kw: Any):  # type: ignore[no-untyped-def]
    """Save ``case``'s model with ``save_pretrained`` into ``root``; return the model."""
    model = hf_model(case)
    model.save_pretrained(root, **save_kw)
    return model


def assert_wrapper_runs_its_text_model(theirs: Any, folder: Any, written: Path,
                                        causal_lm: str, atol: float) -> None:
    """A multimodal wrapper's folder as pivotflow holds it (``folder``: its text model) gives
    the logits transformers' wrapper ``theirs`` gives on text, and, written as a folder, loads
    in transformers as ``causal_lm`` to the same logits."""
    transformers = pytest.importorskip("transformers")
    from pivotflow.engines.torch.weights import build_model
    from pivotflow.params.hf_folder import write_folder

    ids = torch.tensor([PROMPTS[2] * 10])
    ours = build_model(folder.config, folder.tensors)
    with torch.no_grad():
        reference = theirs(input_ids=ids).logits
        torch.testing.assert_close(ours(ids), reference, atol=atol, rtol=0)
    write_folder(written, folder.hf_config, folder.tensors)
    again = transformers.AutoModelForCausalLM.from_pretrained(written).eval()
    assert type(again).__name__ == causal_lm
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, reference, atol=atol, rtol=0)


def assert_lora_names_the_wrappers_text_model(theirs: Any, folder: Path) -> None:
    """A LoRA run's PEFT adapter on the wrapper folder ``folder`` names the modules
    transformers' wrapper ``theirs`` holds its text model's under (PEFT's module names), and
    its ``target_modules`` pattern matches those of every text layer and none of a vision
    tower's (``wrapper_layout.wrapper_adapters``, ``wrapper_target``)."""
    import re

    from pivotflow.params.hf_layout import fused_adapters, fused_targets

    raw = json.loads((folder / "config.json").read_text())
    modules = dict(theirs.named_modules())
    pattern = fused_targets(raw, ["q_proj", "o_proj"])
    assert isinstance(pattern, str)
    adapted = [n for n in modules if re.fullmatch(pattern, n)]
    text = theirs.config.get_text_config()
    assert len(adapted) == 2 * text.num_hidden_layers, adapted
    assert not any("vision" in n or "visual" in n for n in adapted)
    exported, _, _ = fused_adapters(raw, {"model.layers.0.self_attn.o_proj.lora_A":
                                          torch.ones(4, text.hidden_size)}, 4, 16.0)
    (name,) = exported
    assert name.removesuffix(".lora_A") in modules, name


def hf_greedy(model, prompts: list[list[int]], n: int) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """transformers' greedy continuation of each prompt, one prompt at a time (no padding)."""
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n
            )
            out.append(gen[0, len(p) :].tolist())
    return out


def hf_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """log p(response token) from one full forward pass over prompt + response (float32)."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def bf16_logprob_errors(case: Case, root: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(the embedded engine's, transformers' own) bf16 sampled tokens' logprob errors against
    the float32 model's exact ones, pooled over three seeds' samples of every prompt, for
    ``case``'s model saved in ``root``."""
    import copy

    from pivotflow.engines.base import GenerationRequest, SamplingParams
    from pivotflow.engines.torch import TorchEngine, load_model_folder

    model = save_folder(case, root)
    folder = load_model_folder(root)
    theirs = copy.deepcopy(model).to(torch.bfloat16)
    ours_err, theirs_err = [], []
    for seed in range(3):
        engine = TorchEngine(folder.config, max_batch=8, dtype="bf16")
        engine.load_weights(folder.tensors, version=0)
        outs = engine.generate([GenerationRequest(f"p{i}", p, SamplingParams(
            temperature=1.0, max_tokens=16, seed=10 * seed + i)) for i, p in enumerate(PROMPTS)])
        for out, prompt in zip(outs, PROMPTS, strict=True):
            exact = hf_logprobs(model, prompt, out.token_ids)
            ours_err.append((torch.tensor(out.logprobs) - exact).abs())
            theirs_err.append((hf_logprobs(theirs, prompt, out.token_ids) - exact).abs())
    return torch.cat(ours_err), torch.cat(theirs_err)


def assert_states_follow_long_prompts(case: Case, root: Path) -> None:
    """Prompts of 70 and 100 tokens (past one chunk of a linear layer's scan) among short ones,
    through an engine of 2 slots: prompts wait, join a running batch and leave it at different
    lengths (the last slot moves into the hole, its states with it). Every greedy continuation
    equals transformers' on its prompt alone."""
    from pivotflow.engines.base import GenerationRequest, SamplingParams
    from pivotflow.engines.torch import TorchEngine, load_model_folder

    model = save_folder(case, root)
    folder = load_model_folder(root)
    engine = TorchEngine(folder.config, max_batch=2, dtype="fp32")
    engine.load_weights(folder.tensors, version=0)
    prompts = [PROMPTS[2] * 10, PROMPTS[0], [(7 * i) % 300 for i in range(100)], PROMPTS[4]]
    lengths = [12, 5, 9, 14]
    outs = engine.generate([GenerationRequest(f"p{i}", p, SamplingParams(
        temperature=0.0, max_tokens=n)) for i, (p, n) in enumerate(zip(prompts, lengths,
                                                                          strict=True))])
    for out, prompt, n in zip(outs, prompts, lengths, strict=True):
        assert out.token_ids == hf_greedy(model, [prompt], n)[0]


def assert_config_error(raw: dict[str, Any], message: str) -> None:
    """``config_from_hf`` on ``raw`` (through JSON, as read from a file named c.json) raises
    one short line: "c.json: " then ``message``, where a "[...]" in ``message`` stands for the
    offending list, which the error names."""
    from pivotflow.engines.torch import config_from_hf
    from pivotflow.errors import ModelConfigError

    with pytest.raises(ModelConfigError) as err:
        config_from_hf(json.loads(json.dumps(raw)), "c.json")
    text = str(err.value)
    if "[...]" in message:  # (the list itself is in the message: compare around it)
        head, tail = message.split("[...]")
        assert text.startswith(f"c.json: {head}") and text.endswith(tail), text
    else:
        assert text.startswith("c.json: ") and text.endswith(message), text
    assert "\n" not in text and len(text) < 400
