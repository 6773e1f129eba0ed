"""Checkpoints are whole or invisible: a write cut short (the controller killed mid-write)
leaves the previous checkpoint as the one to resume from."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from pivotflow import checkpoints
from pivotflow.controller.snapshot import ControllerState
from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.errors import CheckpointError
from pivotflow.params.shm_store import ShmParamStore

CFG = ModelConfig(vocab_size=99, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)


def state(version: int) -> ControllerState:
    return ControllerState(version=version, tokens_generated=0, ledger={}, settled_below=0,
                           settled_above=[], open_groups={}, next_sample=0,
                           source_rng=[3, [0] * 625, None], problems_cursor=0,
                           problems_rng=[3, [0] * 625, None], samples=[])


def test_a_torn_write_is_never_resumed_from(tmp_path: Path) -> None:
    store = ShmParamStore(tmp_path / "store")
    torch.manual_seed(0)
    for v in (2, 4):
        store.publish("policy", v, Decoder(CFG).state_dict(), CFG)
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
    store.publish("policy", 1, Decoder(CFG).state_dict(), CFG)
    path = checkpoints.write(tmp_path / "run", "policy", store, state(1))
    (path / "state.msgpack").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match="unreadable"):
        checkpoints.read(path)
