"""Checkpoints in Hugging Face layout: transformers round trips, mismatches, corrupt files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from engine_fixtures import CONFIG, tiny_weights

from pivotflow.engines.base import GenerationRequest, SamplingParams
from pivotflow.engines.torch import Decoder, TorchEngine, load_checkpoint, save_checkpoint
from pivotflow.errors import CheckpointError, ModelConfigError

HF_SIZES = dict(
    vocab_size=99,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def _hf_model(kind: str, tied: bool):  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(**HF_SIZES, tie_word_embeddings=tied, rope_theta=5000.0)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(**HF_SIZES, tie_word_embeddings=tied, rope_theta=5000.0)
        model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # sharper than HF's init, so greedy paths are not near-ties
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    return model.eval()


@pytest.mark.parametrize(("kind", "tied"), [("qwen2", True), ("qwen2", False), ("llama", False)])
def test_transformers_checkpoint_generates_like_transformers(
    tmp_path: Path, kind: str, tied: bool
) -> None:
    model = _hf_model(kind, tied)
    model.save_pretrained(tmp_path, safe_serialization=True)
    config, tensors = load_checkpoint(tmp_path)
    assert config.architecture == kind and config.tie_word_embeddings == tied
    assert config.attention_bias == (kind == "qwen2") and config.rope_theta == 5000.0
    prompts = [[1, 40, 41, 42], [1, 50, 60, 70]]
    with torch.no_grad():
        hf = model.generate(
            torch.tensor(prompts),
            attention_mask=torch.ones(2, 4, dtype=torch.long),
            do_sample=False,
            max_new_tokens=20,
            min_new_tokens=20,
            eos_token_id=None,
            pad_token_id=0,
        )
    engine = TorchEngine(config)
    engine.load_weights(tensors, version=0)
    outs = engine.generate(
        [
            GenerationRequest(f"p{i}", p, SamplingParams(temperature=0.0, max_tokens=20))
            for i, p in enumerate(prompts)
        ]
    )
    assert [o.token_ids for o in outs] == hf[:, 4:].tolist()


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_saved_checkpoint_loads_in_transformers_with_equal_logits(
    tmp_path: Path, architecture: str
) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = (
        CONFIG
        if architecture == "qwen2"
        else type(CONFIG)(
            **{
                **{f: getattr(CONFIG, f) for f in CONFIG.__struct_fields__},
                "architecture": "llama",
                "attention_bias": False,
                "tie_word_embeddings": False,
            }
        )
    )
    torch.manual_seed(0)
    ours = Decoder(cfg).eval()
    save_checkpoint(tmp_path, cfg, ours.state_dict())
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(3, cfg.vocab_size, (2, 10))
    with torch.no_grad():
        assert torch.allclose(ours(ids), theirs(ids).logits, atol=1e-5)
    loaded_cfg, tensors = load_checkpoint(tmp_path)
    assert loaded_cfg == cfg
    assert all(torch.equal(tensors[k], v) for k, v in ours.state_dict().items() if k in tensors)


def _saved(tmp_path: Path) -> Path:
    save_checkpoint(tmp_path, CONFIG, tiny_weights())
    return tmp_path


def _edit_config(path: Path, **changes: object) -> None:
    raw = json.loads((path / "config.json").read_text())
    raw.update(changes)
    (path / "config.json").write_text(json.dumps(raw))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_hidden_layers": 3}, r"model\.safetensors.*'model\.layers\.2\..*' is missing"),
        ({"num_hidden_layers": 1}, r"model\.safetensors.*unexpected tensor 'model\.layers\.1\."),
        ({"intermediate_size": 96}, r"model\.safetensors.*'model\.layers\.0\.mlp\..*' has shape"),
        ({"tie_word_embeddings": False}, r"'lm_head\.weight' is missing"),
        (
            {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},
            r"config\.json: rope_parameters\.rope_type='dynamic' is not supported",
        ),
        (
            {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]},
            r"config\.json: model_type='gpt2' is not supported",
        ),
    ],
)
def test_mismatched_checkpoint_raises_model_config_error(
    tmp_path: Path, changes: dict, message: str
) -> None:  # type: ignore[type-arg]
    _edit_config(_saved(tmp_path), **changes)
    with pytest.raises(ModelConfigError, match=message):
        load_checkpoint(tmp_path)


def test_corrupt_or_missing_files_raise_checkpoint_error(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    (path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        load_checkpoint(path)
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        load_checkpoint(path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json"):
        load_checkpoint(path)


def test_load_weights_rejects_a_mismatched_tensor_set(make, weights) -> None:  # type: ignore[no-untyped-def]
    engine = make()
    missing = {k: v for k, v in weights.items() if k != "model.norm.weight"}
    with pytest.raises(ModelConfigError, match="'model.norm.weight' is missing"):
        engine.load_weights(missing, 1)
    wrong = {**weights, "model.norm.weight": torch.ones(3)}
    with pytest.raises(ModelConfigError, match="'model.norm.weight' has shape"):
        engine.load_weights(wrong, 1)
    with pytest.raises(ModelConfigError, match="unexpected tensor 'extra'"):
        engine.load_weights({**weights, "extra": torch.ones(1)}, 1)
    assert engine.version == 0  # nothing was loaded
    untied = {k: v for k, v in weights.items() if k != "lm_head.weight"}
    engine.load_weights(untied, 2)  # tied embeddings: the head may be absent
    assert engine.version == 2
