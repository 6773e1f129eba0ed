"""Checkpoints are whole or invisible: a write cut short (the controller killed mid-write)
leaves the previous checkpoint as the one to resume from; a checkpoint's policy is a Hugging
Face folder transformers loads, and resuming puts back exactly what the store held."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pivotflow import checkpoints
from pivotflow.controller.snapshot import ControllerState
from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.engines.torch.weights import config_to_hf
from pivotflow.errors import CheckpointError
from pivotflow.params.shm_store import ShmParamStore

CFG = ModelConfig(vocab_size=99, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
HF = config_to_hf(CFG, torch.float32)  # what the store holds: the model's config.json


def state(version: int) -> ControllerState:
    return ControllerState(version=version, tokens_generated=0, ledger={}, settled_below=0,
                           settled_above=[], open_groups={}, next_sample=0,
                           source_rng=[3, [0] * 625, None], problems_cursor=0,
                           problems_rng=[3, [0] * 625, None], samples=[])


def test_a_torn_write_is_never_resumed_from(tmp_path: Path) -> None:
    store = ShmParamStore(tmp_path / "store")
    torch.manual_seed(0)
    for v in (2, 4):
        store.publish("policy", v, Decoder(CFG).state_dict(), HF)
    first = checkpoints.write(tmp_path / "run", "policy", store, state(2))
    second = checkpoints.write(tmp_path / "run", "policy", store, state(4))
    assert checkpoints.latest(tmp_path / "run") == second
    # killed mid-write of step 6: a temp folder, never renamed, and LATEST not moved
    torn = tmp_path / "run" / "checkpoints" / ".tmp-step-000006-1"
    shutil.copytree(second, torn)
    (torn / "manifest.json").unlink()
    assert checkpoints.latest(tmp_path / "run") == second
    # killed between the rename and LATEST: the folder is whole, so it is the newest
    (second / "manifest.json").unlink()  # now step 4 is torn instead
    assert checkpoints.latest(tmp_path / "run") == first
    assert checkpoints.read(first).step == 2


def test_a_damaged_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    store = ShmParamStore(tmp_path / "store")
    store.publish("policy", 1, Decoder(CFG).state_dict(), HF)
    path = checkpoints.write(tmp_path / "run", "policy", store, state(1))
    (path / "state.msgpack").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match="state.msgpack is damaged .*sha256"):
        checkpoints.read(path)
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["checksums"]  # as checkpoints were written before they had checksums
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="unreadable"):
        checkpoints.read(path)


def test_a_checkpoint_loads_in_transformers_and_resumes_exactly(tmp_path: Path) -> None:
    from hf_folders import save_tokenizer_hf, train_bpe
    from transformers import AutoModelForCausalLM, AutoTokenizer

    vocab = save_tokenizer_hf(train_bpe(), tmp_path / "model")  # the model folder's tokenizer
    (tmp_path / "model" / "generation_config.json").write_text('{"eos_token_id": 0}')
    cfg = ModelConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    hf = {**config_to_hf(cfg, torch.float32), "eos_token_id": 0, "bos_token_id": None}
    store = ShmParamStore(tmp_path / "store")
    torch.manual_seed(0)
    weights = Decoder(cfg).state_dict()
    weights.pop("lm_head.weight", None)  # tied: the trainer publishes the embedding once
    optim = {"model.norm.weight.exp_avg": torch.full((16,), 0.5),
             "model.norm.weight.step": torch.tensor(3.0)}
    store.publish("policy", 3, weights, hf)
    store.publish("policy.optim", 3, optim, hf)
    path = checkpoints.write(tmp_path / "run", "policy", store, state(3),
                             tokenizer_dir=tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(path / "policy")
    torch.testing.assert_close(model.get_input_embeddings().weight.detach(),
                               weights["model.embed_tokens.weight"], rtol=0, atol=0)
    assert AutoTokenizer.from_pretrained(path / "policy").encode("12 + 34") != []
    assert (path / "policy" / "generation_config.json").read_text() == '{"eos_token_id": 0}'
    fresh = ShmParamStore(tmp_path / "fresh")
    checkpoints.publish(checkpoints.read(path), "policy", fresh)
    version, config, back = fresh.load("policy")
    assert (version, config) == (3, hf)
    assert back.keys() == weights.keys() and all(torch.equal(back[k], weights[k]) for k in back)
    _, optim_config, optim_back = fresh.load("policy.optim")
    assert optim_config == hf and all(torch.equal(optim_back[k], optim[k]) for k in optim)


def test_a_flipped_byte_passes_the_newest_over_for_the_one_before(tmp_path: Path) -> None:
    store = ShmParamStore(tmp_path / "store")
    torch.manual_seed(0)
    for v in (2, 4):
        store.publish("policy", v, Decoder(CFG).state_dict(), HF)
        store.publish("policy.optim", v, {"w.exp_avg": torch.full((8,), float(v))}, HF)
    checkpoints.write(tmp_path / "run", "policy", store, state(2))
    newest = checkpoints.write(tmp_path / "run", "policy", store, state(4))
    optim = newest / "optimizer.safetensors"
    data = bytearray(optim.read_bytes())
    data[-3] ^= 0x40  # inside a tensor's bytes: safetensors would load it without a word
    optim.write_bytes(bytes(data))
    ckpt, passed_over = checkpoints.newest_whole(tmp_path / "run")
    assert ckpt is not None and ckpt.step == 2
    assert passed_over == [f"checkpoint {newest}: optimizer.safetensors is damaged (its "
                           "sha256 does not match the manifest's)"]
    shutil.rmtree(ckpt.path)  # and with no whole one left, it is an error listing why
    with pytest.raises(CheckpointError, match="no whole checkpoint under .*optimizer"):
        checkpoints.newest_whole(tmp_path / "run")


def test_what_a_killed_write_left_is_swept_and_a_live_ones_is_not(tmp_path: Path) -> None:
    store = ShmParamStore(tmp_path / "store")
    store.publish("policy", 1, Decoder(CFG).state_dict(), HF)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    gone, live = int(dead.stdout), os.getppid()  # an exited process; the one running pytest
    root = tmp_path / "run" / "checkpoints"
    for name in (f".tmp-step-000009-{gone}", f".tmp-step-000009-{live}"):
        (root / name / "policy").mkdir(parents=True)
    (root / f".LATEST.{gone}").write_text("step-000009")
    # killed between the output policy folder's two renames: the old one is the only copy
    (root / f".old-policy-{gone}").mkdir()
    checkpoints.write(tmp_path / "run", "policy", store, state(1))
    assert sorted(p.name for p in root.iterdir()) == [
        f".tmp-step-000009-{live}", "LATEST", "policy", "step-000001"]
