"""``pivotflow model FOLDER``: read a Hugging Face model folder as a run would (config,
weights, tokenizer, generation config; every fault the one-line error a run would stop with)
and say what pivotflow will run, before a graph names it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pivotflow.engines.torch.model_config import ModelConfig


def _gemma4_lines(cfg: ModelConfig) -> list[str]:
    """Gemma 4's full layers' heads and rope, its per-layer inputs and KV sharing."""
    if not cfg.global_head_dim:
        return []
    full = next((i for i in range(cfg.num_hidden_layers) if not cfg.is_sliding(i)), 0)
    turning = (int(cfg.partial_rotary_factor * cfg.global_head_dim // 2) * 2
               if cfg.rope_type == "proportional" else cfg.global_head_dim)
    out = [f"  full layers: heads of {cfg.global_head_dim} on {cfg.layer_kv_heads(full)} kv "
           f"heads{', values equal to keys' if cfg.attention_k_eq_v else ''}; {turning} of "
           f"{cfg.global_head_dim} dimensions turn"]
    if cfg.hidden_size_per_layer_input:
        out.append(f"  per-layer inputs of {cfg.hidden_size_per_layer_input}")
    if cfg.num_kv_shared_layers:
        out.append(f"  the last {cfg.num_kv_shared_layers} layers attend over earlier layers' "
                   "keys and values" + ("; their MLPs twice as wide"
                                        if cfg.use_double_wide_mlp else ""))
    return out


def describe_model(path: Path) -> str:
    """What the folder holds, as pivotflow reads it: its family and shape, attention (rope,
    context, windows), experts, weights, tokenizer and stop ids. Raises the PivotflowError a
    run would raise for the same folder."""
    from pivotflow.engines.torch.rope import rope_attention_factor
    from pivotflow.engines.torch.weights import load_model_folder
    from pivotflow.errors import CheckpointError
    from pivotflow.params.fp8_blocks import is_fp8_blocks
    from pivotflow.params.held_config import family_of
    from pivotflow.params.hf_folder import read_config
    from pivotflow.params.mxfp4 import is_mxfp4
    from pivotflow.run_models import tokenizer_of

    if not path.is_dir():
        raise CheckpointError(f"{path}: no such model folder")
    folder = load_model_folder(path)
    cfg = folder.config
    tok = tokenizer_of(path, cfg.vocab_size)
    params = sum(t.numel() for t in folder.tensors.values())
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in folder.tensors.values()})
    head = f"{cfg.architecture}" + (f" (a {cfg.num_labels}-output classifier)"
                                    if cfg.num_labels else "")
    rope = cfg.rope_type + ("" if cfg.rope_type == "default" else f", factor {cfg.rope_factor:g}")
    if rope_attention_factor(cfg) != 1.0:
        rope += f", attention factor {rope_attention_factor(cfg):.4f}"
    if cfg.rotary_dim != cfg.head_dim:
        where = "last" if cfg.latent_attention else "first"
        rope += f", the {where} {cfg.rotary_dim} of {cfg.head_dim} dimensions turn"
    if cfg.nope_layers:
        rope += f", none on {len(cfg.nope_layers)} of {cfg.num_hidden_layers} layers (NoPE)"
    lines = [
        f"{path}: {head}, {params / 1e6:.1f}M parameters ({', '.join(dtypes)}), "
        f"{'tied' if cfg.tie_word_embeddings else 'untied'} embeddings",
        f"  layers {cfg.num_hidden_layers}, hidden {cfg.hidden_size}, heads "
        f"{cfg.num_attention_heads} on {cfg.num_key_value_heads} kv heads of {cfg.head_dim}",
        f"  rope {rope} (theta {cfg.rope_theta:g}); context {cfg.context_limit} "
        f"({cfg.context_key})",
    ]
    lines.extend(_gemma4_lines(cfg))
    if cfg.latent_attention:
        q = f"a {cfg.q_lora_rank} latent" if cfg.q_lora_rank else "q_proj"
        lines.append(f"  latent attention: keys and values from a {cfg.kv_lora_rank} latent, "
                     f"queries from {q}; values {cfg.v_head_dim} wide")
    if cfg.linear_attention_layers and cfg.mamba:
        lines.append(
            f"  Mamba2 on {len(cfg.linear_attention_layers)} of {cfg.num_hidden_layers} layers: "
            f"{cfg.mamba_n_heads} heads of {cfg.mamba_d_head}, state {cfg.mamba_d_state} in "
            f"{cfg.mamba_n_groups} group(s), a {cfg.mamba_d_conv}-tap convolution")
    elif cfg.linear_attention_layers and not cfg.short_conv:
        lines.append(
            f"  linear attention (gated DeltaNet) on {len(cfg.linear_attention_layers)} of "
            f"{cfg.num_hidden_layers} layers: {cfg.linear_num_value_heads} value heads of "
            f"{cfg.linear_value_head_dim} on {cfg.linear_num_key_heads} key heads of "
            f"{cfg.linear_key_head_dim}, a {cfg.linear_conv_kernel_dim}-tap convolution"
            + ("; the others' attention output gated" if cfg.attn_output_gate else "")
            + ("; writes at up to twice the rate" if cfg.linear_allow_neg_eigval else ""))
    if cfg.attn_output_gate and not cfg.linear_attention_layers:  # (AFMoE's, MiniCPM5's)
        lines.append("  attention output gated by a sigmoid")
    if cfg.short_conv and cfg.linear_attention_layers:
        lines.append(f"  gated short convolutions on {len(cfg.linear_attention_layers)} of "
                     f"{cfg.num_hidden_layers} layers: {cfg.linear_conv_kernel_dim} taps")
    if cfg.architecture == "nemotron_h":
        lines.append(f"  one block a layer: {len(cfg.linear_attention_layers)} Mamba2, "
                     f"{len(cfg.attention_layers)} attention, {len(cfg.mlp_blocks)} MLP "
                     "(ungated, relu^2)")
    if cfg.attention_sinks:
        lines.append("  attention sinks: a learned logit per head")
    if cfg.attn_logit_softcapping or cfg.final_logit_softcapping:
        lines.append(f"  soft-capping: attention scores {cfg.attn_logit_softcapping or 'none'}, "
                     f"logits {cfg.final_logit_softcapping or 'none'}")
    if cfg.sliding_layers:
        kind = "chunks of" if cfg.attention_chunk_size else "sliding window"
        lines.append(f"  {kind} {cfg.sliding_window} on {len(cfg.sliding_layers)} of "
                     f"{cfg.num_hidden_layers} layers")
    if cfg.qk_norm_per_head:
        lines.append("  q/k LayerNorms per head, each head's weight its own")
    if cfg.weightless_qk_norm:
        lines.append("  q/k RMS-normalised per head without a weight on the rope layers")
    if cfg.attn_scale:
        lines.append(f"  NoPE layers' queries times 1 + {cfg.attn_scale:g} log(1 + "
                     f"floor((p + 1) / {cfg.floor_scale:g}))")
    if cfg.sparse_layers:
        lines.append(f"  experts {cfg.num_experts} ({cfg.num_experts_per_tok} a token) on "
                     f"{cfg.sparse_layers} of {cfg.num_hidden_layers} layers"
                     + (", beside each MLP" if cfg.experts_beside_mlp else "") + _router(cfg))
    raw = read_config(path)  # (as the file says it: a run holds what held_config gives)
    mtp = (raw.get("num_nextn_predict_layers") or raw.get("mtp_num_hidden_layers")
           or raw.get("num_mtp_modules") or 0)
    layout = {"phi3": "q/k/v and gate/up fused in the file, held split",
              "mixtral": "block_sparse_moe and w1/w2/w3 in the file, held as mlp.experts",
              "glm4": "gate/up fused and q/k turning in interleaved pairs in the file, held "
                      "split and reordered",
              "glm4_moe": f"{mtp} multi-token-prediction layer(s) in the file, not loaded",
              "glm4_moe_lite": f"{mtp} multi-token-prediction layer(s) in the file, not "
                               "loaded",
              "deepseek_v3": f"{mtp} multi-token-prediction layer(s) in the file, not loaded",
              "afmoe": "attention's gate_proj, router and MLP norms under AFMoE's names in "
                       "the file, held inside q_proj and under the common ones",
              "hy_v3": "router, its correction bias and shared MLP as mlp.router.gate, "
                       "mlp.expert_bias and mlp.shared_mlp in the file, held as mlp.gate (the "
                       "bias on it) and mlp.shared_experts",
              "apertus": "norms as attention_layernorm/feedforward_layernorm in the file, held "
                         "as input_layernorm/post_attention_layernorm",
              "mistral4": "experts stacked in the file (gate_up_proj, down_proj), held one "
                          "at a time",
              "gemma4_text": "router and stacked experts on each layer in the file, held "
                             "beside its MLP as moe.gate and one expert at a time",
              "gpt_oss": "router and experts fused in the file"
                         + (" in MXFP4, dequantized to bfloat16" if is_mxfp4(raw) else "")
                         + ", held one expert at a time",
              "gemma3": "Gemma3ForConditionalGeneration's text model held (as "
                        "Gemma3ForCausalLM), its vision tower and projector not loaded",
              "gemma4": "Gemma4ForConditionalGeneration's text model held (as "
                        "Gemma4ForCausalLM), its vision and audio towers not loaded",
              "llama4": "Llama4ForConditionalGeneration's text model held (as "
                        "Llama4ForCausalLM), its vision model and projector not loaded",
              "mistral3": "Mistral3ForConditionalGeneration's text model held (as "
                          f"{folder.hf_config['architectures'][0]}), its vision tower and "
                          "projector not loaded",
              "qwen3_5_text": f"{mtp} multi-token-prediction layer(s) in the file, not loaded",
              "qwen3_5_moe_text": f"{mtp} multi-token-prediction layer(s) in the file, not "
                                  "loaded",
              "lfm2_moe": "norms, attention output, MLP and experts under LFM2's names in the "
                          "file, held under the common ones",
              "lfm2": "norms, attention output and MLP under LFM2's names in the file, held "
                      "under the common ones",
              "ernie4_5": "rotary pairs interleaved in the file, q/k rows held reordered",
              "llama4_text": "rotary pairs interleaved in the file, q/k rows held reordered; "
                             "router, shared expert and input-major expert stacks under "
                             "feed_forward, held as mlp.gate, mlp.shared_experts and one "
                             "expert at a time",
              **dict.fromkeys(("cohere2", "cohere"), "rotary pairs interleaved in the file, q/k "
                                                     "rows held reordered"),
              "ernie4_5_moe": "rotary pairs interleaved in the file, q/k rows held reordered; "
                              "its router's correction bias as moe_statics, held on the router"
                              + (f"; {mtp} multi-token-prediction layer(s), not loaded" if mtp
                                 else ""),
              "hunyuan_v1_dense": "q/k norms as query_layernorm/key_layernorm in the file, held "
                                  "as q_norm/k_norm",
              "hunyuan_v1_moe": "q/k norms, router and shared MLP as query_layernorm/"
                                "key_layernorm, gate.wg and shared_mlp in the file, held as "
                                "q_norm/k_norm, gate and shared_experts",
              "olmo_hybrid": "DeltaNet projections and convolutions apart in the file, held "
                             "stacked as Qwen3.5's",
              "minimax_m2": "block_sparse_moe and w1/w2/w3 in the file, held as mlp.experts"
                            + (f"; {mtp} multi-token-prediction layer(s), not loaded" if mtp
                               else ""),
              "nemotron_h": "backbone.* and each block's mixer in the file, held under the "
                            "common names",
              "granitemoehybrid": "shared MLP's gate/up fused"
                                  + (" and experts stacked" if raw.get("num_local_experts", 8)
                                     else "") + " in the file, held split",
              "granitemoe": "experts stacked (gate/up fused) in the file, held split",
              "granitemoeshared": "shared MLP's gate/up fused and experts stacked in the file, "
                                  "held split",
              "qwen3_next": "DeltaNet projections fused and grouped by key head in the file "
                            "(in_proj_qkvz, in_proj_ba), held split"
                            + (f"; {mtp} multi-token-prediction layer(s), not loaded" if mtp
                               else ""),
              "kimi_k25": "Kimi K2.5's text model held (as DeepseekV3ForCausalLM), its vision "
                          "tower and projector not loaded",
              "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration's text model held (as "
                             "Qwen3_5MoeForCausalLM), its vision tower and multi-token-prediction "
                             "layer not loaded",
              **{kind: f"{cls}ForConditionalGeneration's text model held (as {lm}, its "
                       "multimodal rope as the plain rope it is on text), its vision tower not "
                       "loaded" + (", its experts stacked in the file held one at a time"
                                   if kind == "qwen3_vl_moe" else "")
                 for kind, cls, lm in (("qwen2_vl", "Qwen2VL", "Qwen2ForCausalLM"),
                                       ("qwen2_5_vl", "Qwen2_5_VL", "Qwen2ForCausalLM"),
                                       ("qwen3_vl", "Qwen3VL", "Qwen3ForCausalLM"),
                                       ("qwen3_vl_moe", "Qwen3VLMoe", "Qwen3MoeForCausalLM"),
                                       ("glm4v", "Glm4v", "Glm4ForCausalLM"),
                                       ("glm4v_moe", "Glm4vMoe", "Glm4MoeForCausalLM"),
                                       ("glm46v", "Glm46V", folder.hf_config["architectures"][0]))},
              **{kind: f"{cls}ForConditionalGeneration's text model held (as "
                       f"{folder.hf_config['architectures'][0]}), its vision tower and "
                       "projector not loaded"
                 for kind, cls in (("internvl", "InternVL"), ("llava", "Llava"),
                                   ("llava_next", "LlavaNext"),
                                   ("llava_onevision", "LlavaOnevision"))},
              "qwen3_5": "Qwen3_5ForConditionalGeneration's text model held (as "
                         "Qwen3_5ForCausalLM), its vision tower and multi-token-prediction "
                         "layer not loaded"}
    # (a layout note only where the file has a multi-token-prediction layer)
    mtp_only = ("glm4_moe", "deepseek_v3", "qwen3_5_text", "qwen3_5_moe_text", "glm4_moe_lite")
    if (family := family_of(raw)) is not None and (family not in mtp_only or mtp):
        lines.append(f"  tensors: {layout[family]}")
    if is_fp8_blocks(raw):
        rows, cols = raw["quantization_config"]["weight_block_size"]
        lines.append(f"  weights: block-wise FP8 in the file ({rows}x{cols} blocks), dequantized "
                     "to bfloat16")
    template = "a chat template" if tok.chat_template else "no chat template"
    lines.append(f"  tokenizer: {tok.vocab_size} tokens, {template}; stop ids "
                 f"{list(folder.eos_ids) or 'none'}")
    return "\n".join(lines)


def describe_families() -> str:
    """The model_types a folder's config.json may name: the decoders the embedded engine (and
    the trainer) runs, and the multimodal wrappers whose text model it runs."""
    import textwrap

    from pivotflow.engines.torch.architectures import ARCHITECTURES
    from pivotflow.params.held_config import WRAPPERS

    fixed = [f"{name} -> {kind}" for name, (kind, _, _) in WRAPPERS.items() if kind]
    named = [name for name, (kind, _, _) in WRAPPERS.items() if not kind]
    return "\n".join([
        f"decoders ({len(ARCHITECTURES)}):",
        textwrap.indent(textwrap.fill(", ".join(ARCHITECTURES), 76), "  "),
        f"multimodal wrappers, run as their text model ({len(WRAPPERS)}):",
        textwrap.indent(textwrap.fill(", ".join(fixed), 76), "  "),
        textwrap.indent(textwrap.fill(", ".join(named) + " -> the decoder their text_config "
                                      "names", 76), "  ")])


def _router(cfg: ModelConfig) -> str:
    """A sigmoid router's differences from the plain top k, shared experts included."""
    parts = []
    if cfg.router_scales_input:  # (Llama 4's)
        parts.append("sigmoid router, each expert reading its token times its weight")
    elif cfg.scoring_func == "sigmoid":
        parts.append("sigmoid router with a correction bias")
    elif cfg.router_bias:
        parts.append("softmax router with a correction bias")
    if cfg.scoring_func == "topk_softmax":
        parts.append(f"a softmax over the chosen logits, biased experts with a gate clamped at "
                     f"{cfg.swiglu_limit:g}")
    if cfg.n_group > 1:
        parts.append(f"from the best {cfg.topk_group} of {cfg.n_group} groups")
    if cfg.routed_scaling_factor != 1.0:
        parts.append(f"weights times {cfg.routed_scaling_factor:g}")
    if cfg.n_shared_experts:
        parts.append(f"{cfg.n_shared_experts} shared")
    if cfg.shared_expert_intermediate_size:
        parts.append(f"a gated shared expert of {cfg.shared_expert_intermediate_size}")
    if cfg.shared_intermediate_size:
        parts.append(f"a shared MLP of {cfg.shared_intermediate_size}")
    return f"; {', '.join(parts)}" if parts else ""
