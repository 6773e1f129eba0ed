"""Multimodal wrappers on vLLM (CPU build), as a rollout worker serves them: the store holds
the wrapper's text model under its causal LM's config (``held_config``), vLLM starts from that
config (no vision tower) and decodes the store's version greedily as the embedded engine does:
Gemma 3 4B+'s kind (Gemma3ForConditionalGeneration), Llama 4's, Qwen3-VL-MoE's (its multimodal rope
served as plain rope, its stacked experts one at a time, its router renormalising) and
GLM-4.5V's (as GLM-4.5).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from vllm_fixtures import EOS, MAX_LEN, save_sharpened  # noqa: E402
from vllm_serving import greedy, vllm_greedy  # noqa: E402

from pivotflow.engines.torch.engine import TorchEngine  # noqa: E402

pytestmark = pytest.mark.timeout(900)


def test_vllm_serves_a_gemma3_4b_kind_of_folder_as_its_text_model(
    tmp_path: Path, folder: Path, vllm_engine: Any
) -> None:
    """A Gemma3ForConditionalGeneration folder (Gemma 3 4B+), as a rollout worker serves it:
    the store holds its text model under the causal LM's config (``held_config``), vLLM starts
    from that config (Gemma3ForCausalLM, no vision tower) and decodes the store's version as
    the embedded engine does."""
    import transformers

    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    config = transformers.Gemma3Config(
        text_config={"vocab_size": vocab, "hidden_size": 128, "intermediate_size": 256,
                     "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "head_dim": 32, "max_position_embeddings": MAX_LEN, "sliding_window": 6,
                     "eos_token_id": EOS, "bos_token_id": EOS, "pad_token_id": EOS},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 28, "patch_size": 14},
        mm_tokens_per_image=4, image_token_index=vocab - 1, boi_token_index=vocab - 3,
        eoi_token_index=vocab - 2)
    torch.manual_seed(0)
    (tmp_path / "model").mkdir()
    path = save_sharpened(transformers.Gemma3ForConditionalGeneration(config),
                          tmp_path / "model", folder)
    _assert_vllm_serves_the_text_model(tmp_path, path, "Gemma3ForCausalLM")


def test_vllm_serves_a_llama4_folder_as_its_text_model(
    tmp_path: Path, folder: Path
) -> None:
    """A Llama4ForConditionalGeneration folder (Scout's and Maverick's kind: chunks of 32 on
    its rope layers, every other layer 1 of 4 experts beside a shared one, its experts stacked
    input-major): the store holds its Llama4ForCausalLM, vLLM serves it (told the query
    temperature, and blocks of 32 that its chunks hold) and decodes as the embedded engine
    does."""
    import transformers

    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    config = transformers.Llama4Config(
        text_config={"vocab_size": vocab, "hidden_size": 128, "intermediate_size": 64,
                     "intermediate_size_mlp": 256, "num_hidden_layers": 4,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                     "max_position_embeddings": MAX_LEN, "num_local_experts": 4,
                     "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
                     "attention_chunk_size": 32, "floor_scale": 4, "attn_scale": 0.5,
                     "eos_token_id": EOS, "bos_token_id": EOS, "pad_token_id": EOS},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
                       "vision_output_dim": 32, "projector_input_dim": 32,
                       "projector_output_dim": 64})
    torch.manual_seed(0)
    (tmp_path / "model").mkdir()
    path = save_sharpened(transformers.Llama4ForConditionalGeneration(config),
                          tmp_path / "model", folder)
    _assert_vllm_serves_the_text_model(tmp_path, path, "Llama4ForCausalLM")


def _assert_vllm_serves_the_text_model(tmp_path: Path, path: Path, causal_lm: str) -> None:
    """The wrapper folder ``path`` is held as ``causal_lm``, and vLLM decodes the store's
    version of it greedily as the embedded engine does."""
    from pivotflow.engines.torch.weights import load_model_folder

    held = load_model_folder(path)
    assert held.hf_config["architectures"] == [causal_lm]
    ours = TorchEngine(held.config, max_batch=8, eos_token_id=EOS)
    ours.load_weights(held.tensors, 0)
    expected = greedy(ours)
    assert sum(len(t) for t in expected.values()) >= 100
    assert vllm_greedy(tmp_path, path) == expected


def test_vllm_serves_a_qwen3_vl_moe_folder_as_its_text_model(
    tmp_path: Path, folder: Path
) -> None:
    """A Qwen3VLMoeForConditionalGeneration folder (Qwen3-VL-30B-A3B's kind), its experts
    stacked input-major as the Hub's are: vLLM serves the held Qwen3MoeForCausalLM (its
    multimodal sections dropped from the rope: vLLM would otherwise ask for multimodal
    positions its plain class has not) and decodes as the embedded engine does."""
    import transformers
    from safetensors.torch import load_file, save_file


    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    config = transformers.Qwen3VLMoeConfig(
        text_config={"vocab_size": vocab, "hidden_size": 128, "intermediate_size": 256,
                     "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "head_dim": 32, "max_position_embeddings": MAX_LEN,
                     "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
                     "rope_parameters": {"rope_type": "default", "mrope_section": [8, 4, 4],
                                         "mrope_interleaved": True, "rope_theta": 5e6},
                     "eos_token_id": EOS, "bos_token_id": EOS, "pad_token_id": EOS},
        vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2,
                       "out_hidden_size": 128, "deepstack_visual_indexes": [0],
                       "num_position_embeddings": 64},
        image_token_id=vocab - 1, video_token_id=vocab - 2, vision_start_token_id=vocab - 3,
        vision_end_token_id=vocab - 4)
    torch.manual_seed(0)
    (tmp_path / "model").mkdir()
    path = save_sharpened(transformers.Qwen3VLMoeForConditionalGeneration(config),
                          tmp_path / "model", folder)
    for shard in path.glob("*.safetensors"):  # (the Hub's stacks: [E, H, 2I] and [E, I, H])
        tensors = load_file(str(shard))
        save_file({n: t.transpose(1, 2).contiguous() if n.endswith("_proj") and t.dim() == 3
                   else t for n, t in tensors.items()}, str(shard), metadata={"format": "pt"})
    _assert_vllm_serves_the_text_model(tmp_path, path, "Qwen3MoeForCausalLM")


def test_vllm_serves_a_glm4_5v_folder_as_its_text_model(tmp_path: Path, folder: Path) -> None:
    """A Glm4vMoeForConditionalGeneration folder (GLM-4.5V's and GLM-4.6V's kind): vLLM serves
    the held Glm4MoeForCausalLM (half of each head turning in interleaved pairs, a dense layer
    then experts behind a sigmoid router with a correction bias) and decodes as the embedded
    engine does."""
    import transformers


    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    config = transformers.Glm4vMoeConfig(
        text_config={"vocab_size": vocab, "hidden_size": 128, "intermediate_size": 256,
                     "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "head_dim": 32, "max_position_embeddings": MAX_LEN,
                     "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                     "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
                     "rope_parameters": {"rope_type": "default", "mrope_section": [2, 2, 4],
                                         "partial_rotary_factor": 0.5, "rope_theta": 1e4},
                     "eos_token_id": EOS, "bos_token_id": EOS, "pad_token_id": EOS},
        vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2,
                       "out_hidden_size": 128, "patch_size": 14, "spatial_merge_size": 2,
                       "temporal_patch_size": 2},
        image_token_id=vocab - 1, video_token_id=vocab - 2, image_start_token_id=vocab - 3,
        image_end_token_id=vocab - 4, video_start_token_id=vocab - 5,
        video_end_token_id=vocab - 6)
    torch.manual_seed(0)
    (tmp_path / "model").mkdir()
    path = save_sharpened(transformers.Glm4vMoeForConditionalGeneration(config),
                          tmp_path / "model", folder)
    _assert_vllm_serves_the_text_model(tmp_path, path, "Glm4MoeForCausalLM")
