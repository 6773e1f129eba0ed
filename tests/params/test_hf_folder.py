"""Model folders as the store reads and writes them (config.json kept as data, safetensors), and
the directory backend built on them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from pivotflow.errors import CheckpointError
from pivotflow.params.hf_folder import read_folder, write_folder
from pivotflow.params.store import DirectoryParamStore

# Keys the torch engine does not know stay as they are: the store never interprets them.
CFG = {"model_type": "qwen3", "vocab_size": 11, "tie_word_embeddings": True, "dtype": "bfloat16",
       "rope_scaling": {"rope_type": "yarn", "factor": 4.0}, "layer_types": ["full_attention"]}


def tensors() -> dict[str, torch.Tensor]:
    embed = torch.randn(11, 4, generator=torch.Generator().manual_seed(0))
    return {"model.embed_tokens.weight": embed, "lm_head.weight": embed,  # tied: one storage
            "model.norm.weight": torch.ones(4, dtype=torch.bfloat16)}


def test_a_folder_round_trips_config_and_tensors_as_they_are(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "tokenizer.json").write_text("{}")
    (src / "generation_config.json").write_text('{"eos_token_id": [2, 3]}')
    write_folder(tmp_path / "out", CFG, tensors(), side_files_from=src)
    config, back = read_folder(tmp_path / "out")
    assert config == CFG
    assert back.keys() == tensors().keys()
    for name, t in tensors().items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
    assert (tmp_path / "out" / "tokenizer.json").read_text() == "{}"
    assert json.loads((tmp_path / "out" / "generation_config.json").read_text()) == {
        "eos_token_id": [2, 3]}
    assert not list((tmp_path / "out").glob("*.tmp"))


def test_sharded_folders_are_read_and_missing_files_named(tmp_path: Path) -> None:
    t = tensors()
    (tmp_path / "config.json").write_text(json.dumps(CFG))
    save_file({"model.embed_tokens.weight": t["model.embed_tokens.weight"]},
              str(tmp_path / "a.safetensors"))
    save_file({"model.norm.weight": t["model.norm.weight"]}, str(tmp_path / "b.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "model.embed_tokens.weight": "a.safetensors", "model.norm.weight": "b.safetensors"}}))
    _, back = read_folder(tmp_path)
    assert sorted(back) == ["model.embed_tokens.weight", "model.norm.weight"]
    (tmp_path / "b.safetensors").unlink()
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'b.safetensors'} is missing"):
        read_folder(tmp_path)
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'config.json'}: expected a JSON "
                       "object, got list"):
        read_folder(tmp_path)


def test_the_directory_backend_keeps_the_dict(tmp_path: Path) -> None:
    store = DirectoryParamStore(tmp_path)
    for v in (1, 2, 3):
        store.publish("policy", v, tensors(), CFG)
    version, config, back = store.load("policy")
    assert (version, config) == (3, CFG) and torch.equal(back["model.norm.weight"],
                                                         tensors()["model.norm.weight"])
    assert store.versions("policy") == [1, 2, 3] and store.versions("judge") == []
    store.gc("policy", keep=2)
    assert sorted(p.name for p in (tmp_path / "policy").glob("v*")) == ["v00000002", "v00000003"]
    assert store.versions("policy") == [2, 3]
    with pytest.raises(CheckpointError, match="the config must be the model's Hugging Face"):
        store.publish("policy", 4, tensors(), ["not", "a", "dict"])  # type: ignore[arg-type]
    assert store.latest("policy") == 3
