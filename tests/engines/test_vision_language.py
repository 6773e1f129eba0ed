"""Vision-language folders (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE, GLM-4.1V, GLM-4.5V:
the models most vision RL starts from) run their text model: pivotflow holds it as Qwen2's,
Qwen3's, Qwen3-MoE's, GLM-4's or GLM-4.5's, with the logits transformers' own wrapper gives on
text, greedy tokens the wrapper's, and writes the plain causal LM's folder; the Hub's older
layouts (Qwen2.5-VL's flat config, Qwen3-VL-MoE's input-major expert stacks) read alike, and a
stack of a shape that says neither way is a one-line error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_fixtures import (
    PROMPTS,
    assert_lora_names_the_wrappers_text_model,
    assert_wrapper_runs_its_text_model,
    hf_greedy,
)

from pivotflow.engines.base import GenerationRequest, SamplingParams
from pivotflow.engines.torch import TorchEngine, load_model_folder
from pivotflow.errors import ModelConfigError

transformers = pytest.importorskip("transformers")

TEXT: dict[str, Any] = dict(vocab_size=300, hidden_size=64, intermediate_size=96,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=16, max_position_embeddings=256)
# (each multimodal rope's sections sum to half a head: 8)
_QWEN2_ROPE = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e6}
_QWEN3_ROPE = {"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True,
               "rope_theta": 5e6}
_QWEN3_VISION = dict(depth=1, hidden_size=32, intermediate_size=48, num_heads=2,
                     out_hidden_size=64, deepstack_visual_indexes=[0], num_position_embeddings=64)
_GLM_VISION = dict(depth=1, hidden_size=32, intermediate_size=48, num_heads=2,
                   out_hidden_size=64, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
# (family, its wrapper's config class, text config, vision config, the held causal LM)
KINDS: dict[str, tuple[str, dict[str, Any], dict[str, Any], str]] = {
    "qwen2_vl": ("Qwen2VLConfig", {**TEXT, "rope_parameters": _QWEN2_ROPE},
                 dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2),
                 "Qwen2ForCausalLM"),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", {**TEXT, "rope_parameters": _QWEN2_ROPE},
                   dict(depth=1, hidden_size=32, intermediate_size=48, num_heads=2,
                        out_hidden_size=64, fullatt_block_indexes=[0], window_size=28),
                   "Qwen2ForCausalLM"),
    "qwen3_vl": ("Qwen3VLConfig", {**TEXT, "rope_parameters": _QWEN3_ROPE}, _QWEN3_VISION,
                 "Qwen3ForCausalLM"),
    # (experts 24 wide: their stacks [4, 48, 64] and [4, 64, 24] say which way they lie)
    "qwen3_vl_moe": ("Qwen3VLMoeConfig", {**TEXT, "rope_parameters": _QWEN3_ROPE,
                                          "moe_intermediate_size": 24, "num_experts": 4,
                                          "num_experts_per_tok": 2}, _QWEN3_VISION,
                     "Qwen3MoeForCausalLM"),
    # (GLM-4.1V: every dimension of its heads turning, in interleaved pairs; GLM-4.5V: half,
    # a dense layer then a sparse one with a sigmoid router's correction bias)
    "glm4v": ("Glm4vConfig", {**TEXT, "head_dim": None, "rope_parameters": {
        "rope_type": "default", "mrope_section": [2, 3, 3], "partial_rotary_factor": 1.0,
        "rope_theta": 1e4}}, _GLM_VISION, "Glm4ForCausalLM"),
    "glm4v_moe": ("Glm4vMoeConfig", {**TEXT, "n_routed_experts": 4, "num_experts_per_tok": 2,
                                     "moe_intermediate_size": 24, "first_k_dense_replace": 1,
                                     "rope_parameters": {"rope_type": "default",
                                                         "mrope_section": [1, 1, 2],
                                                         "partial_rotary_factor": 0.5,
                                                         "rope_theta": 1e4}},
                  _GLM_VISION, "Glm4MoeForCausalLM"),
    # (GLM-4.6V's wrapper: GLM-4.6V-Flash's GLM-4.1V text model, GLM-4.6V's GLM-4.5V one)
    "glm46v": ("Glm46VConfig", {
        **TEXT, "model_type": "glm4v_text", "head_dim": None, "rope_parameters": {
            "rope_type": "default", "mrope_section": [2, 3, 3], "partial_rotary_factor": 1.0,
            "rope_theta": 1e4}}, _GLM_VISION, "Glm4ForCausalLM"),
    # (its experts saved stacked by transformers 5, as Qwen3-VL-MoE's)
    "glm46v-moe": ("Glm46VConfig", {
        **TEXT, "model_type": "glm4v_moe_text", "n_routed_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 24, "first_k_dense_replace": 1,
        "rope_parameters": {"rope_type": "default", "mrope_section": [1, 1, 2],
                            "partial_rotary_factor": 0.5, "rope_theta": 1e4}},
        _GLM_VISION, "Glm4MoeForCausalLM"),
}


def _wrapper(kind: str, root: Path, tied: bool = False) -> Any:
    """transformers' ``kind`` wrapper with sharp random weights, saved into ``root``."""
    config_class, text, vision, _ = KINDS[kind]
    config = getattr(transformers, config_class)(text_config=text, vision_config=vision,
                                                 tie_word_embeddings=tied)
    torch.manual_seed(0)
    model = getattr(transformers, config_class.replace("Config", "ForConditionalGeneration"))(
        config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.15)
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.1)
        for name, b in model.named_buffers():  # (GLM-4.5V's router bias: so that it counts)
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.1)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.save_pretrained(root)
    return model


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_vision_language_folder_runs_its_text_model_as_transformers_wrapper_does(
        tmp_path: Path, kind: str) -> None:
    theirs = _wrapper(kind, tmp_path / "wrapper")
    folder = load_model_folder(tmp_path / "wrapper")
    causal_lm = KINDS[kind][3]
    assert folder.hf_config["architectures"] == [causal_lm]
    assert "mrope_section" not in json.dumps(folder.hf_config)  # (plain rope, as vLLM reads)
    assert not any("visual" in n for n in folder.tensors)
    assert not folder.config.tie_word_embeddings
    if kind in ("qwen3_vl_moe", "glm4v_moe", "glm46v-moe"):
        assert folder.config.num_experts == 4 and folder.config.norm_topk_prob
    if kind == "qwen3_vl_moe":
        assert folder.tensors["model.layers.1.mlp.experts.3.up_proj.weight"].shape == (24, 64)
    assert_wrapper_runs_its_text_model(theirs, folder, tmp_path / "written", causal_lm,
                                       atol=1e-5)
    assert_lora_names_the_wrappers_text_model(theirs, tmp_path / "wrapper")
    engine = TorchEngine(folder.config, max_batch=8, dtype="fp32")
    engine.load_weights(folder.tensors, version=0)
    ours = engine.generate([GenerationRequest(f"p{i}", p, SamplingParams(temperature=0.0,
                                                                          max_tokens=12))
                            for i, p in enumerate(PROMPTS)])
    assert [o.token_ids for o in ours] == hf_greedy(theirs, PROMPTS, 12)


def test_the_hubs_flat_qwen2_5_vl_config_reads_as_its_nested_one(tmp_path: Path) -> None:
    """Qwen2.5-VL's Hub configs (transformers 4.49's) keep the text model's keys at the top,
    with no text_config, and say the rope ``{"type": "mrope", ...}``."""
    theirs = _wrapper("qwen2_5_vl", tmp_path, tied=True)
    nested = json.loads((tmp_path / "config.json").read_text())
    flat = {k: v for k, v in nested.items() if k != "text_config"}
    text = {k: v for k, v in nested["text_config"].items() if k != "rope_parameters"}
    flat.update(text, model_type="qwen2_5_vl", tie_word_embeddings=True, rope_theta=1e6,
                rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    (tmp_path / "config.json").write_text(json.dumps(flat))
    folder = load_model_folder(tmp_path)
    assert folder.config.tie_word_embeddings and folder.config.rope_theta == 1e6
    assert folder.config.rms_norm_eps == nested["text_config"]["rms_norm_eps"]
    assert_wrapper_runs_its_text_model(theirs, folder, tmp_path / "written", "Qwen2ForCausalLM",
                                       atol=1e-5)


def _restack(root: Path, turn: Any) -> None:
    """Rewrite ``root``'s expert stacks with ``turn`` (the rest as they are)."""
    from safetensors.torch import load_file, save_file

    path = root / "model.safetensors"
    tensors = load_file(str(path))
    save_file({n: turn(t).contiguous() if n.endswith(("gate_up_proj", "down_proj")) else t
               for n, t in tensors.items()}, str(path), metadata={"format": "pt"})


def test_qwen3_vl_moe_experts_stacked_input_major_as_the_hub_ships_them_read_alike(
        tmp_path: Path) -> None:
    theirs = _wrapper("qwen3_vl_moe", tmp_path / "saved")
    ours = load_model_folder(tmp_path / "saved").tensors
    _wrapper("qwen3_vl_moe", tmp_path / "hub")
    _restack(tmp_path / "hub", lambda t: t.transpose(1, 2))  # ([E, H, 2I], [E, I, H])
    hub = load_model_folder(tmp_path / "hub")
    assert hub.tensors.keys() == ours.keys()
    for name, t in ours.items():
        torch.testing.assert_close(hub.tensors[name], t, atol=0, rtol=0)
    assert_wrapper_runs_its_text_model(theirs, hub, tmp_path / "written", "Qwen3MoeForCausalLM",
                                       atol=1e-5)


def test_an_expert_stack_of_another_shape_is_a_one_line_error(tmp_path: Path) -> None:
    _wrapper("qwen3_vl_moe", tmp_path)
    _restack(tmp_path, lambda t: t[:, :-1])
    with pytest.raises(ModelConfigError) as err:
        load_model_folder(tmp_path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 'model.safetensors'}: ")
    assert "'model.language_model.layers.0.mlp.experts.down_proj' has shape [4, 63, 24], not " \
           "[4, 24, 64] (input-major) or [4, 64, 24]" in message


def test_a_qwen_vl_wrappers_own_tying_decides_false_where_it_says_nothing() -> None:
    """Qwen3-VL-MoE's text config defaults to tied, its wrapper to untied, and the wrapper's
    says (transformers 5 ties by it): the Hub's Qwen3-VL-30B-A3B config names no tying in
    its text_config and false at the top; with neither, untied."""
    from pivotflow.engines.torch.hf_config import config_from_hf
    from pivotflow.params.held_config import held_config

    text = {**KINDS["qwen3_vl_moe"][1], "model_type": "qwen3_vl_moe_text",
            "tie_word_embeddings": True}
    wrapper = {"model_type": "qwen3_vl_moe", "text_config": text}
    assert not config_from_hf(held_config(wrapper), "c.json").tie_word_embeddings
    tied = {**wrapper, "tie_word_embeddings": True}
    assert config_from_hf(held_config(tied), "c.json").tie_word_embeddings


def test_a_square_expert_stack_is_refused_rather_than_read_one_way() -> None:
    """Experts half as wide as the model fuse gate and up into a square [E, H, H]: input-major
    and output-major look alike there, so pivotflow says so instead of guessing."""
    from pivotflow.engines.torch.hf_config import config_from_hf
    from pivotflow.params.stacked_experts import split_stacks

    cfg = config_from_hf({**TEXT, "model_type": "qwen3_moe", "num_experts": 4,
                          "num_experts_per_tok": 2, "moe_intermediate_size": 32}, "c.json")
    stack = torch.zeros(4, 64, 64)
    with pytest.raises(ModelConfigError, match=r"^f: tensor 'model\.layers\.0\.mlp\.experts\."
                       r"gate_up_proj' has shape \[4, 64, 64\], .* \(square: which way it lies "
                       r"cannot be told\)$"):
        split_stacks(cfg, {"model.layers.0.mlp.experts.gate_up_proj": stack}, "f")


def test_pivotflow_model_says_a_qwen_vl_folder_runs_its_text_model(tmp_path: Path) -> None:
    from hf_folders import save_tokenizer_hf, train_bpe

    from pivotflow.model_info import describe_model

    _wrapper("qwen3_vl_moe", tmp_path)
    save_tokenizer_hf(train_bpe(vocab_size=260), tmp_path)
    said = describe_model(tmp_path)
    assert said.startswith(f"{tmp_path}: qwen3_moe, ")  # (the text model it runs)
    assert ("\n  tensors: Qwen3VLMoeForConditionalGeneration's text model held (as "
            "Qwen3MoeForCausalLM, its multimodal rope as the plain rope it is on text), its "
            "vision tower not loaded, its experts stacked in the file held one at a time") in said


# InternVL's and LLaVA's wrappers: whatever text model their text_config names (InternVL3.5's
# Qwen3, Qwen3-MoE or gpt-oss; LLaVA's Qwen2, Llama, Mistral...)
_SIGLIP = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
               image_size=28, patch_size=14)
NAMED: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "internvl-qwen3": ("InternVLConfig", {**TEXT, "model_type": "qwen3"}, _SIGLIP),
    "internvl-qwen3-moe": ("InternVLConfig", {**TEXT, "model_type": "qwen3_moe",
                                              "num_experts": 4, "num_experts_per_tok": 2,
                                              "moe_intermediate_size": 24,
                                              "norm_topk_prob": True}, _SIGLIP),
    # (Ministral 3's folders: Mistral3ForConditionalGeneration around a ministral3 text model)
    "mistral3-ministral3": ("Mistral3Config", {
        **TEXT, "model_type": "ministral3", "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
            "original_max_position_embeddings": 8, "llama_4_scaling_beta": 0.1}},
        {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
         "head_dim": 16}),
    "llava-qwen2": ("LlavaConfig", {**TEXT, "model_type": "qwen2"},
                    {**_SIGLIP, "model_type": "clip_vision_model", "projection_dim": 32}),
}


@pytest.mark.parametrize("name", list(NAMED))
def test_a_wrapper_runs_the_text_model_its_text_config_names(tmp_path: Path, name: str) -> None:
    config_class, text, vision = NAMED[name]
    config = getattr(transformers, config_class)(text_config=text, vision_config=vision)
    torch.manual_seed(0)
    theirs = getattr(transformers, config_class.replace("Config", "ForConditionalGeneration"))(
        config).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.15)
    theirs.save_pretrained(tmp_path / "wrapper")
    folder = load_model_folder(tmp_path / "wrapper")
    causal_lm = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                 "qwen2": "Qwen2ForCausalLM",
                 "ministral3": "Ministral3ForCausalLM"}[text["model_type"]]
    assert folder.hf_config["architectures"] == [causal_lm]
    assert not any(n.startswith(("vision", "multi_modal")) for n in folder.tensors)
    assert_wrapper_runs_its_text_model(theirs, folder, tmp_path / "written", causal_lm,
                                       atol=1e-5)
    assert_lora_names_the_wrappers_text_model(theirs, tmp_path / "wrapper")
    from hf_folders import save_tokenizer_hf, train_bpe

    from pivotflow.model_info import describe_model

    save_tokenizer_hf(train_bpe(vocab_size=260), tmp_path / "wrapper")
    assert (f"\n  tensors: {config_class.removesuffix('Config')}ForConditionalGeneration's text "
            f"model held (as {causal_lm}), its vision tower and projector not loaded"
            ) in describe_model(tmp_path / "wrapper")


def test_a_wrappers_text_model_of_a_family_pivotflow_does_not_run_is_one_line() -> None:
    from pivotflow.params.held_config import held_config

    wrapper = {"model_type": "llava", "text_config": {**TEXT, "model_type": "falcon_h1"}}
    with pytest.raises(ModelConfigError, match=r"^c\.json text_config: model_type='falcon_h1' is "
                       r"not supported by the embedded engine as llava's text model \(qwen2, "):
        held_config(wrapper, "c.json")
