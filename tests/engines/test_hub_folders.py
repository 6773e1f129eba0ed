"""Folders as the Hub ships them (Gemma 3 4B+'s, Gemma 4's and Mistral Small 3.1's multimodal
wrappers,
a Gemma 2 reward model, gpt-oss in MXFP4, MiniMax-M2 with its remote code's keys, EXAONE 4.0's
window patterns) read as transformers reads them, and each family's own one-line config
errors (OLMoE's q/k clipping, ERNIE 4.5's biases, Seed-OSS's o_proj bias, Hunyuan's shared
layer KV, length-dependent rope and uneven expert counts, Mistral 4's query width and rotary
share, and its grouped routing on vLLM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_fixtures import (
    AFMOE,
    ARCEE,
    COHERE2,
    GEMMA2,
    GEMMA3,
    GEMMA4,
    GPT_OSS,
    LLAMA4,
    MINIMAX_M2,
    MISTRAL4,
    MISTRAL_WINDOW,
    PROMPTS,
    SIZES,
    assert_lora_names_the_wrappers_text_model,
    assert_wrapper_runs_its_text_model,
    hf_model,
    save_folder,
    sharpened,
)

from pivotflow.engines.torch import config_from_hf, load_model_folder
from pivotflow.engines.torch.weights import build_model
from pivotflow.errors import ModelConfigError

transformers = pytest.importorskip("transformers")


def _gemma3_wrapper(root: Path) -> Any:
    """A Gemma 3 4B+'s kind of folder (Gemma3ForConditionalGeneration: the text model of the
    GEMMA3 case, a one-layer vision tower and its projector), saved by transformers."""
    transformers = pytest.importorskip("transformers")
    text = hf_model(GEMMA3)
    config = transformers.Gemma3Config(
        text_config=text.config.to_dict(), mm_tokens_per_image=4, image_token_index=299,
        boi_token_index=297, eoi_token_index=298,
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 28, "patch_size": 14})
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    model.model.language_model.load_state_dict(text.model.state_dict())
    model.save_pretrained(root)
    return model


def test_a_gemma3_4b_kind_of_folder_runs_its_text_model_and_writes_a_causal_lm(
        tmp_path: Path) -> None:
    """Gemma 3 4B and larger ship as Gemma3ForConditionalGeneration: the text model under
    ``language_model.``, its config in ``text_config``. pivotflow holds the text model alone
    (the vision tower left out), decodes as transformers' wrapper does on text, and writes a
    Gemma3ForCausalLM that transformers loads to the same logits."""
    theirs = _gemma3_wrapper(tmp_path / "wrapper")
    folder = load_model_folder(tmp_path / "wrapper")
    assert folder.hf_config["architectures"] == ["Gemma3ForCausalLM"]
    assert folder.config == load_model_folder_of(GEMMA3, tmp_path / "text").config
    assert not any("vision" in n or "projector" in n for n in folder.tensors)
    assert_wrapper_runs_its_text_model(theirs, folder, tmp_path / "written", "Gemma3ForCausalLM",
                                       atol=1e-5)


def test_a_gemma4_folder_runs_its_text_model_and_writes_a_causal_lm(tmp_path: Path) -> None:
    """Every Gemma 4 ships as Gemma4ForConditionalGeneration (its text model under
    ``model.language_model.``, a vision tower and its embedder beside): pivotflow holds the
    text model alone, decodes as transformers' wrapper does on text, and writes a
    Gemma4ForCausalLM that transformers loads to the same logits."""
    text = hf_model(GEMMA4)
    config = transformers.Gemma4Config(
        text_config=text.config.to_dict(), audio_config=None,
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 2})
    theirs = transformers.Gemma4ForConditionalGeneration(config).eval()
    theirs.model.language_model.load_state_dict(text.model.state_dict())
    theirs.save_pretrained(tmp_path / "wrapper")
    folder = load_model_folder(tmp_path / "wrapper")
    assert folder.hf_config["architectures"] == ["Gemma4ForCausalLM"]
    assert folder.config == load_model_folder_of(GEMMA4, tmp_path / "text").config
    assert not any("vision" in n for n in folder.tensors)
    assert_wrapper_runs_its_text_model(theirs, folder, tmp_path / "written", "Gemma4ForCausalLM",
                                       atol=1e-5)
    assert_lora_names_the_wrappers_text_model(theirs, tmp_path / "wrapper")


def test_a_gemma4_12b_folder_runs_as_gemma4(tmp_path: Path) -> None:
    """gemma-4-12B ships as Gemma4UnifiedForConditionalGeneration (text model
    ``gemma4_unified_text``: Gemma 4's without per-layer inputs or experts; image tokens
    attending both ways, text causally): held as gemma4_text, it decodes as transformers'
    wrapper does on text and writes a Gemma4ForCausalLM that transformers loads to the same
    logits; its text model alone (Gemma4UnifiedForCausalLM) reads the same."""
    text = {**{k: v for k, v in GEMMA4.extra.items() if k != "hidden_size_per_layer_input"},
            **{k: SIZES[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                                     "max_position_embeddings")},
            "num_kv_shared_layers": 1, "tie_word_embeddings": True}
    config = transformers.Gemma4UnifiedConfig(
        text_config=text, audio_config=None,
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 2})
    assert config.text_config.use_bidirectional_attention == "vision"
    torch.manual_seed(0)
    theirs = sharpened(transformers.Gemma4UnifiedForConditionalGeneration(config))
    theirs.save_pretrained(tmp_path / "wrapper")
    folder = load_model_folder(tmp_path / "wrapper")
    assert folder.hf_config["architectures"] == ["Gemma4ForCausalLM"]
    assert (folder.config.architecture, folder.config.hidden_size_per_layer_input) == (
        "gemma4_text", 0)
    assert folder.config.num_kv_shared_layers == 1 and folder.config.attention_k_eq_v
    assert_wrapper_runs_its_text_model(theirs, folder, tmp_path / "written", "Gemma4ForCausalLM",
                                       atol=1e-5)
    alone = transformers.Gemma4UnifiedForCausalLM(config.text_config).eval()
    alone.model.load_state_dict(theirs.model.language_model.state_dict())
    alone.save_pretrained(tmp_path / "text")
    text_folder = load_model_folder(tmp_path / "text")
    assert text_folder.config == folder.config
    ids = torch.tensor([PROMPTS[2] * 10])
    with torch.no_grad():
        torch.testing.assert_close(build_model(text_folder.config, text_folder.tensors)(ids),
                                   alone(input_ids=ids).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("key, value, message", [
    ("enable_moe_block", True, "num_experts=None is not a non-negative integer"),
    ("use_bidirectional_attention", "all", "use_bidirectional_attention='all' is not supported"),
    ("num_kv_shared_layers", 4, "num_kv_shared_layers 4 must leave, before them, a layer of "
     "each type"),
    ("vocab_size_per_layer_input", 100, r"vocab_size_per_layer_input \(100\) cover vocab_size"),
    ("per_layer_config", {"1": {"head_dim": 64}}, "per_layer_config is not supported")])
def test_a_gemma4_config_the_engine_cannot_run_is_a_one_line_error(key: str, value: Any,
                                                                   message: str) -> None:
    """Experts beside the MLP with no count of them, bidirectional attention, KV sharing with
    no layer of a type before it, a per-layer table smaller than the vocabulary, a per-layer
    config that misses a full layer: named in one line, not run as another model."""
    raw = {**hf_model(GEMMA4).config.to_dict(), "hidden_size_per_layer_input": 16, key: value}
    with pytest.raises(ModelConfigError, match=message) as info:
        config_from_hf(raw, "m/config.json")
    assert str(info.value).startswith("m/config.json: ") and "\n" not in str(info.value)


def test_a_gemma4_config_without_its_per_layer_keys_reads_as_transformers_fills_them() -> None:
    """Gemma4TextConfig's defaults: per-layer inputs of 256 from a 262144-token table where a
    config names none, and the full layers' heads 512 wide."""
    raw = hf_model(GEMMA4).config.to_dict()
    for key in ("hidden_size_per_layer_input", "vocab_size_per_layer_input", "per_layer_config"):
        raw.pop(key, None)
    ours = config_from_hf(raw, "config.json")
    theirs = transformers.Gemma4TextConfig(**raw)
    assert ours.hidden_size_per_layer_input == theirs.hidden_size_per_layer_input == 256
    assert ours.vocab_size_per_layer_input == theirs.vocab_size_per_layer_input == 262144
    assert ours.global_head_dim == theirs.per_layer_config[1].head_dim == 512


@pytest.mark.parametrize("key, value, message", [
    ("sliding_window", None, "sliding_window=None is not supported by the embedded engine on "
     "cohere2"),
    ("use_qk_norm", True, "use_qk_norm=True is not supported"),
    ("logit_scale", 0, "logit_scale=0.0 is not positive")])
def test_a_cohere2_config_the_engine_cannot_run_is_a_one_line_error(key: str, value: Any,
                                                                    message: str) -> None:
    """A Cohere 2 with no window (transformers then turns no position on any layer), with
    Cohere 1's q/k norms, or a logit scale of 0: named in one line."""
    raw = {**hf_model(COHERE2).config.to_dict(), key: value}
    with pytest.raises(ModelConfigError, match=message) as info:
        config_from_hf(raw, "m/config.json")
    assert str(info.value).startswith("m/config.json: ") and "\n" not in str(info.value)


def test_cohere2_is_served_by_vllm_with_the_window_transformers_reads() -> None:
    """vLLM 0.32's Cohere 2 lets a sliding layer see its window + 1 positions; told one less
    (``hf_overrides``), it attends where transformers and pivotflow's trainer do
    (tests/with_vllm decodes it so)."""
    from pivotflow.engines.vllm_latent import vllm_overrides

    raw = hf_model(COHERE2).config.to_dict()
    assert vllm_overrides(raw, Path("config.json")) == {"sliding_window": 3}
    assert vllm_overrides({**raw, "model_type": "llama"}, Path("config.json")) == {}


def test_a_llama4_folder_runs_its_text_model_and_writes_a_causal_lm(tmp_path: Path) -> None:
    """Llama 4 Scout and Maverick ship as Llama4ForConditionalGeneration (its text model under
    ``language_model.``, a vision model and projector beside): pivotflow holds the text model
    alone, computes as transformers' wrapper does on text, and writes a Llama4ForCausalLM
    that transformers loads to the same logits."""
    text = hf_model(LLAMA4)
    config = transformers.Llama4Config(
        text_config=text.config.to_dict(),
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
                       "vision_output_dim": 32, "projector_input_dim": 32,
                       "projector_output_dim": 64})
    theirs = transformers.Llama4ForConditionalGeneration(config).eval()
    theirs.language_model.load_state_dict(text.state_dict())
    theirs.save_pretrained(tmp_path / "wrapper")
    folder = load_model_folder(tmp_path / "wrapper")
    assert folder.hf_config["architectures"] == ["Llama4ForCausalLM"]
    assert folder.config == load_model_folder_of(LLAMA4, tmp_path / "text").config
    assert not any("vision" in n or "projector" in n for n in folder.tensors)
    assert_wrapper_runs_its_text_model(theirs, folder, tmp_path / "written", "Llama4ForCausalLM",
                                       atol=1e-5)
    from hf_folders import save_tokenizer_hf, train_bpe

    from pivotflow.model_info import describe_model

    save_tokenizer_hf(train_bpe(vocab_size=260), tmp_path / "wrapper")
    said = describe_model(tmp_path / "wrapper")
    assert said.startswith(f"{tmp_path / 'wrapper'}: llama4_text, ")
    assert ("tensors: Llama4ForConditionalGeneration's text model held (as Llama4ForCausalLM), "
            "its vision model and projector not loaded") in said
    # (a LoRA run's adapters name the wrapper's modules for its text model, as PEFT finds them:
    # language_model.model here, not Gemma's model.language_model; the vision model's not)
    assert_lora_names_the_wrappers_text_model(theirs, tmp_path / "wrapper")


@pytest.mark.parametrize("key, value, message", [
    ("layer_types", ["sliding_attention"] * 4, "layer_types=.* is not a list of "
     "full_attention, chunked_attention"),
    ("attention_chunk_size", 0, "attention_chunk_size=0 is not a positive integer"),
    ("moe_layers", [1, 9], r"moe_layers=\[1, 9\] is not a list of layer numbers below 4"),
    ("no_rope_layers", [1, 1], "no_rope_layers is not a list of 0 and 1, one for each of 4")])
def test_a_llama4_config_the_engine_cannot_read_is_a_one_line_error(key: str, value: Any,
                                                                    message: str) -> None:
    """Llama 4's layer kinds, chunk, sparse layers and NoPE layers, misnamed: one line naming
    the file and the key."""
    raw = {**hf_model(LLAMA4).config.to_dict(), key: value}
    if key == "attention_chunk_size":
        raw.pop("layer_types")  # (derived: its rope layers chunk)
    with pytest.raises(ModelConfigError, match=message) as info:
        config_from_hf(raw, "m/config.json")
    assert str(info.value).startswith("m/config.json: ") and "\n" not in str(info.value)


def test_the_hubs_llama4_scout_config_reads_as_transformers_fills_it() -> None:
    """Scout's text_config (as the Hub's, its keys cut to a few): llama3 rope with equal low
    and high frequency factors (no band blended), chunks of 8192 on three layers of four, the
    fourth NoPE with the query temperature, 16 experts on every layer; Llama4TextConfig's
    defaults for the rest. Maverick's: experts on every other layer, no q/k norms."""
    scout = {"model_type": "llama4_text", "num_hidden_layers": 8, "hidden_size": 5120,
             "intermediate_size": 8192, "intermediate_size_mlp": 16384,
             "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
             "vocab_size": 202048, "max_position_embeddings": 10485760,
             "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                              "original_max_position_embeddings": 8192,
                              "rope_type": "llama3"}}
    cfg = config_from_hf(scout, "scout/config.json")
    assert (cfg.rope_type, cfg.rope_theta, cfg.rope_factor) == ("llama3", 500000.0, 16.0)
    assert cfg.nope_layers == (3, 7) and cfg.sliding_layers == (0, 1, 2, 4, 5, 6)
    assert (cfg.attention_chunk_size, cfg.attn_scale, cfg.floor_scale) == (8192, 0.1, 8192.0)
    assert cfg.weightless_qk_norm and cfg.sparse_layers == 8 and cfg.num_experts == 16
    assert (cfg.intermediate_size, cfg.moe_intermediate_size, cfg.shared_width) == (
        16384, 8192, 8192)
    maverick = config_from_hf({**scout, "interleave_moe_layer_step": 2, "use_qk_norm": False,
                               "num_local_experts": 128, "rope_scaling": None,
                               "no_rope_layers": []},
                              "maverick/config.json")
    assert [maverick.is_sparse(i) for i in range(8)] == [False, True] * 4
    assert not maverick.weightless_qk_norm and maverick.rope_type == "default"
    assert maverick.nope_layers == (3, 7)  # (an empty list: derived)


def test_llama4_is_served_by_vllm_as_transformers_computes_it() -> None:
    """vLLM 0.32 turns Llama 4's query temperature on past 32K positions whatever the config
    says, reads its sparse layers from ``interleave_moe_layer_step`` alone and, on CPU, needs
    chunks of whole KV blocks (multiples of 32): told the config's temperature and a block
    that divides the chunk; sparse layers it would place elsewhere and chunks it cannot hold
    are one-line errors before it starts."""
    from pivotflow.engines.torch.hf_llama4 import llama4_vllm_kwargs
    from pivotflow.errors import EngineError

    raw = {**hf_model(LLAMA4).config.to_dict(), "attention_chunk_size": 96}
    raw.pop("layer_types")
    assert llama4_vllm_kwargs(raw, "m", on_cpu=True) == {
        "override_generation_config": {"attn_temperature_tuning": True}, "block_size": 32}
    assert llama4_vllm_kwargs({**raw, "attn_temperature_tuning": False}, "m", on_cpu=False) == {
        "override_generation_config": {"attn_temperature_tuning": False}}
    wrapper = {"model_type": "llama4", "text_config": {**raw, "attention_chunk_size": 8192}}
    assert llama4_vllm_kwargs(wrapper, "m", on_cpu=True)["block_size"] == 128
    assert llama4_vllm_kwargs({"model_type": "llama"}, "m", on_cpu=True) == {}
    for bad, message in (({"attention_chunk_size": 8}, "attention_chunk_size 8 is not a "
                          "multiple of 32"),
                         ({"moe_layers": [1, 2]}, r"moe_layers \[1, 2\] are not every Nth")):
        with pytest.raises(EngineError, match=message) as info:
            llama4_vllm_kwargs({**raw, **bad}, "m/config.json", on_cpu=True)
        assert str(info.value).startswith("m/config.json: ") and "\n" not in str(info.value)


def load_model_folder_of(case: Any, root: Path) -> Any:
    save_folder(case, root)
    return load_model_folder(root)


def test_the_hubs_sparse_gemma3_text_config_reads_as_transformers_fills_it() -> None:
    """The Hub's Gemma 3 4B+ configs (written by transformers 4.50) name five text keys and
    leave the rest to Gemma3TextConfig's defaults (8 heads on 4 of 256, 262208 tokens...)."""
    transformers = pytest.importorskip("transformers")
    from pivotflow.params.held_config import held_config

    sparse = {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
              "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
              "sliding_window": 1024}  # (gemma-3-4b-it's text_config, whole)
    wrapper = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
               "text_config": sparse, "torch_dtype": "bfloat16"}
    filled = transformers.Gemma3Config(text_config=dict(sparse)).text_config.to_dict()
    ours = config_from_hf(held_config(wrapper), "c.json")
    assert ours == config_from_hf(filled, "c.json")
    assert (ours.num_attention_heads, ours.head_dim, ours.vocab_size) == (8, 256, 262208)
    assert ours.rope_type == "linear" and len(ours.sliding_layers) == 29  # 5 of 6 slide
    assert held_config(wrapper)["torch_dtype"] == "bfloat16"


def test_a_gemma3_config_without_its_text_config_is_one_line(tmp_path: Path) -> None:
    _gemma3_wrapper(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    del raw["text_config"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelConfigError, match=r"config\.json: a gemma3 config needs its text "
                       r"model's config as an object 'text_config', got NoneType$") as exc:
        load_model_folder(tmp_path)
    assert "\n" not in str(exc.value)


def test_a_gemma2_reward_model_scores_as_transformers_without_the_logit_cap(
        tmp_path: Path) -> None:
    """Gemma 2 reward models (Skywork-Reward-Gemma-2-27B's kind: Gemma2ForSequenceClassification)
    read the last token's hidden state through their ``score`` head, never soft-capped (the
    cap is the causal LM head's); its attention's cap holds."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Gemma2Config(**{**SIZES, **GEMMA2.extra}, num_labels=1, pad_token_id=0)
    theirs = transformers.Gemma2ForSequenceClassification(config).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.15)
        theirs.score.weight.mul_(20.0)  # (a score far past the cap of 3, had it been applied)
    theirs.save_pretrained(tmp_path)
    folder = load_model_folder(tmp_path)
    assert (folder.config.architecture, folder.config.num_labels) == ("gemma2", 1)
    ours = build_model(folder.config, folder.tensors)
    ids = torch.tensor([PROMPTS[2] * 3])
    with torch.no_grad():
        expected = theirs(ids).logits[0]
        torch.testing.assert_close(ours(ids)[0, -1], expected, atol=1e-4, rtol=1e-5)
    assert float(expected.abs().max()) > 3.0


def _mistral3_wrapper(text: Any, root: Path) -> Any:
    """A Mistral3ForConditionalGeneration around the transformers text model ``text`` (a
    one-layer Pixtral vision tower beside), saved into ``root``."""
    config = transformers.Mistral3Config(
        text_config=text.config.to_dict(), image_token_index=299,
        vision_config={"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64,
                       "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28,
                       "patch_size": 14, "head_dim": 16})
    theirs = transformers.Mistral3ForConditionalGeneration(config).eval()
    theirs.model.language_model.load_state_dict(text.model.state_dict())
    theirs.save_pretrained(root)
    return theirs


def test_an_arcee_reward_model_scores_as_transformers(tmp_path: Path) -> None:
    """ArceeForSequenceClassification (a reward model or PPO critic of AFM's kind): the last
    token's score through its ungated relu^2 MLPs, as transformers gives it."""
    config = transformers.ArceeConfig(**{**SIZES, **ARCEE.extra}, num_labels=1)
    torch.manual_seed(0)
    theirs = sharpened(transformers.ArceeForSequenceClassification(config))
    theirs.save_pretrained(tmp_path)
    folder = load_model_folder(tmp_path)
    assert (folder.config.architecture, folder.config.num_labels) == ("arcee", 1)
    ids = torch.tensor([PROMPTS[2] * 3])
    with torch.no_grad():
        torch.testing.assert_close(build_model(folder.config, folder.tensors)(ids)[0, -1],
                                   theirs(ids).logits[0], atol=1e-4, rtol=1e-5)


def test_a_mistral_small_3_kind_of_folder_runs_its_text_model(tmp_path: Path) -> None:
    """Mistral Small 3.1+ and Magistral Small 1.2 ship as Mistral3ForConditionalGeneration:
    pivotflow holds the Mistral text model alone, with the logits transformers' wrapper gives
    on text, and writes a MistralForCausalLM; the wrapper's tying decides (transformers 5's
    rule: here tied, so the file has no head)."""
    theirs = _mistral3_wrapper(hf_model(MISTRAL_WINDOW), tmp_path / "wrapper")
    folder = load_model_folder(tmp_path / "wrapper")
    assert folder.hf_config["architectures"] == ["MistralForCausalLM"]
    assert folder.config.tie_word_embeddings and folder.config.sliding_window == 4
    assert_wrapper_runs_its_text_model(theirs, folder, tmp_path / "written", "MistralForCausalLM",
                                       atol=1e-5)
    assert_lora_names_the_wrappers_text_model(theirs, tmp_path / "wrapper")


def test_a_wrappers_tying_is_its_own_where_it_says_it_else_its_text_models() -> None:
    from pivotflow.params.held_config import held_config

    text = {"model_type": "mistral", **SIZES, "head_dim": 32}
    hub = {"model_type": "mistral3", "text_config": text}  # (4.50's: no tying key at all)
    assert not config_from_hf(held_config(hub), "c.json").tie_word_embeddings  # Mistral's
    tied_text = {**hub, "text_config": {**text, "tie_word_embeddings": True}}
    assert config_from_hf(held_config(tied_text), "c.json").tie_word_embeddings
    untied = {**tied_text, "tie_word_embeddings": False}  # (transformers 5 writes this one)
    assert not config_from_hf(held_config(untied), "c.json").tie_word_embeddings


def test_olmoes_qkv_clipping_is_a_one_line_error() -> None:
    raw = {**SIZES, "model_type": "olmoe", "num_experts": 4, "num_experts_per_tok": 2,
           "clip_qkv": 8.0}
    with pytest.raises(ModelConfigError, match=r"^c\.json: clip_qkv=8\.0 is not supported by the "
                       r"embedded engine \(null\)$"):
        config_from_hf(raw, "c.json")


def test_gpt_oss_as_the_hub_ships_it_in_mxfp4_loads_dequantized(tmp_path: Path) -> None:
    """gpt-oss's Hub files hold its experts in MXFP4 (``*_blocks`` of 4-bit codes and
    ``*_scales``, ``quantization_config`` mxfp4): read, they are the bf16 stacks transformers'
    own dequantizer gives, and the folder runs as the bf16 one does; what pivotflow holds and
    writes says no quantization."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    save_folder(GPT_OSS, tmp_path / "bf16")
    tensors = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    quantized = dict(tensors)
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        e, inner, out = tensors[name].shape  # (the file's bf16 stack: [E, in, out])
        blocks = torch.randint(0, 256, (e, out, inner // 32, 16), dtype=torch.uint8, generator=g)
        scales = torch.randint(120, 130, (e, out, inner // 32), dtype=torch.uint8, generator=g)
        del quantized[name]
        quantized[f"{name}_blocks"], quantized[f"{name}_scales"] = blocks, scales
        tensors[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16).float()
    for root, weights, quant in ((tmp_path / "ref", tensors, None),
                                 (tmp_path / "mxfp4", quantized, {"quant_method": "mxfp4"})):
        root.mkdir()
        save_file(weights, str(root / "model.safetensors"))
        config = json.loads((tmp_path / "bf16" / "config.json").read_text())
        (root / "config.json").write_text(json.dumps(
            {**config, **({"quantization_config": quant} if quant else {})}))
    ref, ours = load_model_folder(tmp_path / "ref"), load_model_folder(tmp_path / "mxfp4")
    assert ours.config == ref.config and "quantization_config" not in ours.hf_config
    assert ours.tensors.keys() == ref.tensors.keys()
    for name, t in ref.tensors.items():
        assert torch.equal(ours.tensors[name].float(), t.float()), name
    ids = torch.tensor([PROMPTS[2] * 3])
    with torch.no_grad():
        torch.testing.assert_close(build_model(ours.config, ours.tensors)(ids),
                                   build_model(ref.config, ref.tensors)(ids))
    del quantized["model.layers.1.mlp.experts.down_proj_scales"]
    save_file(quantized, str(tmp_path / "mxfp4" / "model.safetensors"))
    with pytest.raises(ModelConfigError, match=r"tensor 'model\.layers\.1\.mlp\.experts\."
                       r"down_proj_blocks' has no 'model\.layers\.1\.mlp\.experts\."
                       r"down_proj_scales' of shape \(4, 128, 2\) beside it") as exc:
        load_model_folder(tmp_path / "mxfp4")
    assert "\n" not in str(exc.value)


def test_minimax_m2_as_the_hub_ships_it(tmp_path: Path) -> None:
    """The Hub's MiniMax-M2 configs are written for its remote code (auto_map, rotary_dim,
    scoring_func, use_routing_bias, attn_type_list) and its files hold multi-token-prediction
    modules as layers past the decoder's last (num_mtp_modules): read as transformers runs
    it, the modules left out, the remote code dropped, and what vLLM reads said; keys asking
    for other math are one-line errors."""
    from safetensors.torch import load_file, save_file

    model = save_folder(MINIMAX_M2, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.2.self_attn.q_proj.weight"] = torch.zeros(128, 64)  # (an MTP layer's)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    hub = {**config, "auto_map": {"AutoModelForCausalLM": "modeling_minimax_m2.X"},
           "num_mtp_modules": 1, "use_mtp": True, "scoring_func": "sigmoid",
           "use_routing_bias": True, "attn_type_list": [1, 1], "qk_norm_type": "per_layer"}
    (tmp_path / "config.json").write_text(json.dumps(hub))
    folder = load_model_folder(tmp_path)
    assert not any(n.startswith("model.layers.2.") for n in folder.tensors)
    assert "auto_map" not in folder.hf_config and folder.hf_config["num_mtp_modules"] == 0
    assert (folder.hf_config["rotary_dim"], folder.hf_config["scoring_func"]) == (16, "sigmoid")
    ours = build_model(folder.config, folder.tensors)
    ids = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), model(ids).logits, atol=1e-5, rtol=0)
    for key, value, runs in (("use_routing_bias", False, "True"),
                             ("qk_norm_type", "per_head", "'per_layer'"),
                             ("scoring_func", "softmax", "'sigmoid'")):
        with pytest.raises(ModelConfigError) as err:
            config_from_hf({**hub, key: value}, "c.json")
        assert str(err.value) == (f"c.json: {key}={value!r} is not supported by the embedded "
                                  f"engine on minimax_m2 ({runs})")
    with pytest.raises(ModelConfigError) as err:
        config_from_hf({**hub, "attn_type_list": [0, 1]}, "c.json")
    assert str(err.value) == ("c.json: attn_type_list=[0, 1] is not supported by the embedded "
                              "engine on minimax_m2 (every layer 1: full attention)")


def test_exaone4s_window_patterns_read_alike() -> None:
    """EXAONE 4.0's sliding layers from its layer_types, an int pattern (every Nth layer full)
    or a string one ("LLLG"), its full layers then turning no position; without a window,
    every layer full and turning; another pattern a one-line error."""
    base = {**SIZES, "model_type": "exaone4", "num_hidden_layers": 8, "sliding_window": 4}
    types = ["sliding_attention"] * 3 + ["full_attention"]
    plain = config_from_hf({**base, "layer_types": types * 2}, "c.json")
    assert plain.sliding_layers == (0, 1, 2, 4, 5, 6) and plain.nope_layers == (3, 7)
    for pattern in (4, "LLLG"):
        assert config_from_hf({**base, "sliding_window_pattern": pattern}, "c.json") == plain
    none = config_from_hf({**base, "sliding_window": None}, "c.json")
    assert not none.sliding_layers and not none.nope_layers
    with pytest.raises(ModelConfigError) as err:
        config_from_hf({**base, "sliding_window_pattern": "LLXG"}, "c.json")
    assert str(err.value) == ("c.json: sliding_window_pattern='LLXG' is not a positive integer "
                              "or a string of L and G")


def test_an_ernie4_5_with_biases_is_a_one_line_error() -> None:
    """ERNIE 4.5's use_bias puts biases on every projection, its MLP's included, which the
    embedded engine does not run."""
    with pytest.raises(ModelConfigError) as err:
        config_from_hf({**SIZES, "model_type": "ernie4_5", "use_bias": True}, "c.json")
    assert str(err.value) == ("c.json: use_bias=True is not supported by the embedded engine "
                              "on ernie4_5 (false)")


def test_a_mistral_small_4_kind_of_folder_runs_its_text_model(tmp_path: Path) -> None:
    """Mistral Small 4 ships as Mistral3ForConditionalGeneration around a mistral4 text model
    (transformers' auto classes map no causal LM of its own): pivotflow holds the text model,
    its experts stacked in the file held one at a time, with the logits transformers' wrapper
    gives on text, and writes a Mistral4ForCausalLM (loaded by that class)."""
    text = hf_model(MISTRAL4)
    theirs = _mistral3_wrapper(text, tmp_path / "wrapper")
    theirs.lm_head.load_state_dict(text.lm_head.state_dict())  # (untied: the text model's)
    theirs.save_pretrained(tmp_path / "wrapper")
    folder = load_model_folder(tmp_path / "wrapper")
    assert folder.hf_config["architectures"] == ["Mistral4ForCausalLM"]
    assert folder.config.architecture == "mistral4" and folder.config.llama4_scaling_beta == 0.1
    assert "model.layers.1.mlp.experts.7.up_proj.weight" in folder.tensors
    ids = torch.tensor([PROMPTS[2] * 10])
    with torch.no_grad():
        reference = theirs(input_ids=ids).logits
        torch.testing.assert_close(build_model(folder.config, folder.tensors)(ids), reference,
                                   atol=1e-5, rtol=0)
    from pivotflow.params.hf_folder import write_folder

    write_folder(tmp_path / "written", folder.hf_config, folder.tensors)
    again = transformers.Mistral4ForCausalLM.from_pretrained(tmp_path / "written").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("extra", "says"), [
    ({"head_dim": 64}, r"head_dim=64 is not qk_nope_head_dim \+ qk_rope_head_dim = 48 "
                       r"\(mistral4's query width\)"),
    ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
     r"rope_parameters\.partial_rotary_factor=0\.5 is not supported by the embedded engine on "
     r"mistral4 \(qk_rope_head_dim / head_dim = 0\.3333333333333333\)")])
def test_mistral4s_query_width_and_rotary_share_are_checked(extra: dict[str, Any],
                                                           says: str) -> None:
    raw = {**SIZES, **MISTRAL4.extra, "model_type": "mistral4", **extra}
    with pytest.raises(ModelConfigError, match=rf"^c\.json: {says}$"):
        config_from_hf(raw, "c.json")


def test_mistral4s_grouped_routing_is_refused_before_vllm_starts(tmp_path: Path) -> None:
    """vLLM runs Mistral 4 as DeepSeek-V3, whose softmax router ranks groups by their best
    expert where transformers ranks by the two best: one line, not another model."""
    from pivotflow.engines.vllm_latent import vllm_overrides
    from pivotflow.errors import EngineError

    raw = {**SIZES, **MISTRAL4.extra, "model_type": "mistral4"}
    with pytest.raises(EngineError, match=r"^m/config\.json: n_group=2 is not served by vLLM on "
                       r"mistral4 \(1: vLLM ranks groups otherwise than transformers\)$"):
        vllm_overrides(raw, Path("m/config.json"))
    said = vllm_overrides({**raw, "n_group": 1, "topk_group": 1}, Path("m/config.json"))
    assert said["architectures"] == ["DeepseekV3ForCausalLM"]
    assert said["llama_4_scaling"] == {"original_max_position_embeddings": 8, "beta": 0.1}
    assert "partial_rotary_factor" not in said["rope_parameters"]


def test_an_afmoe_q_proj_adapter_exports_as_its_query_and_gate_adapters_exactly() -> None:
    """AFMoE's attention gate is held inside q_proj (each head's query rows, then its gate
    rows); a LoRA adapter of the held q_proj exports as adapters of the file's q_proj and
    self_attn.gate_proj whose updates are the held update's rows."""
    from pivotflow.params.hf_layout import fused_adapters, fused_targets

    config = {**SIZES, **AFMOE.extra, "model_type": "afmoe"}
    heads, d, rank = SIZES["num_attention_heads"], AFMOE.extra["head_dim"], 4
    a, b = torch.randn(rank, SIZES["hidden_size"]), torch.randn(2 * heads * d, rank)
    prefix = "base_model.model.model.layers.0.self_attn."
    out, ranks, alphas = fused_adapters(config, {f"{prefix}q_proj.lora_A": a,
                                                 f"{prefix}q_proj.lora_B": b}, rank, 8.0)
    assert (ranks, alphas) == ({}, {})
    held = (b @ a).view(heads, 2, d, -1)
    for part, i in (("q_proj", 0), ("gate_proj", 1)):
        assert torch.equal(out[f"{prefix}{part}.lora_A"], a)
        torch.testing.assert_close(out[f"{prefix}{part}.lora_B"] @ a,
                                   held[:, i].reshape(heads * d, -1))
    assert fused_targets(config, ["q_proj", "o_proj"]) == ["q_proj", "self_attn.gate_proj",
                                                           "o_proj"]


@pytest.mark.parametrize(("thetas", "rope", "says"), [
    ([1e4, 1e4, 2e4, 3e4], {}, r"layer_rope_theta=\[10000\.0, 10000\.0, 20000\.0, 30000\.0\] is "
     r"not supported by the embedded engine \(one base for the full layers, one for the "
     r"sliding ones, 0 for NoPE\)"),
    ([5e5, 1e4, 1e4, 1e4], {"rope_type": "linear", "factor": 2.0},
     r"layer_rope_theta with two bases and rope_parameters 'linear' is not supported by the "
     r"embedded engine \(plain rope on the sliding layers\)")])
def test_granite_swa_bases_pivotflow_cannot_hold_are_one_line_errors(
        thetas: list[float], rope: dict[str, Any], says: str) -> None:
    raw = {**SIZES, "num_hidden_layers": 4, "model_type": "granite_swa",
           "layer_rope_theta": thetas, **({"rope_parameters": rope} if rope else {})}
    with pytest.raises(ModelConfigError, match=rf"^c\.json: {says}$"):
        config_from_hf(raw, "c.json")


def test_seed_oss_o_proj_bias_is_a_one_line_error() -> None:
    with pytest.raises(ModelConfigError, match=r"^c\.json: attention_out_bias=True is not "
                       r"supported by the embedded engine on seed_oss \(false\)$"):
        config_from_hf({**SIZES, "model_type": "seed_oss", "attention_out_bias": True}, "c.json")


@pytest.mark.parametrize(("key", "value", "runs"), [("use_cla", True, "false"),
                                                     ("use_rotary_pos_emb", False, "true")])
def test_hunyuans_shared_layer_kv_and_no_rope_are_one_line_errors(key: str, value: bool,
                                                                   runs: str) -> None:
    with pytest.raises(ModelConfigError, match=rf"^c\.json: {key}={value} is not supported by "
                       rf"the embedded engine on hunyuan_v1_dense \({runs}\)$"):
        config_from_hf({**SIZES, "model_type": "hunyuan_v1_dense", key: value}, "c.json")


def test_hunyuans_length_dependent_dynamic_rope_is_a_one_line_error() -> None:
    """"dynamic" with an alpha is a fixed stretch of the base; without one, transformers
    rescales by the sequence's length, which no engine here follows."""
    raw = {**SIZES, "model_type": "hunyuan_v1_dense",
           "rope_scaling": {"type": "dynamic", "factor": 2.0}}
    with pytest.raises(ModelConfigError, match=r"^c\.json: rope_scaling\.type='dynamic' is not "
                       r"supported by the embedded engine \("):
        config_from_hf(raw, "c.json")


def test_hunyuan_moe_layers_of_different_expert_counts_are_a_one_line_error() -> None:
    raw = {**SIZES, "model_type": "hunyuan_v1_moe", "num_experts": 4, "moe_topk": [2, 1]}
    with pytest.raises(ModelConfigError, match=r"^c\.json: moe_topk=\[2, 1\] is not supported by "
                       r"the embedded engine \(one positive integer, or the same one for every "
                       r"layer\)$"):
        config_from_hf(raw, "c.json")
