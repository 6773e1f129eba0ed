"""ERNIE 4.5 MoE's folders as the Hub ships them: a multi-token-prediction layer beside the
decoder (``num_nextn_predict_layers``, ``mtp_*`` tensors) left out as the folder is read, the
rest as transformers reads it; its sparse layers written back as the one run it can say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_fixtures import ERNIE4_5_MOE, SIZES, save_folder

from pivotflow.engines.torch import config_from_hf, load_model_folder
from pivotflow.engines.torch.hf_config import config_to_hf
from pivotflow.errors import ModelConfigError


def test_its_multi_token_prediction_layer_is_left_out(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    save_folder(ERNIE4_5_MOE, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    plain = load_model_folder(tmp_path).tensors
    hidden = SIZES["hidden_size"]
    mtp = {"model.mtp_emb_norm.0.weight": torch.ones(hidden),
           "model.mtp_linear_proj.0.weight": torch.ones(hidden, 2 * hidden),
           "model.mtp_block.0.mlp.up_proj.weight": torch.ones(8, hidden)}
    save_file({**tensors, **mtp}, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    folder = load_model_folder(tmp_path)
    assert folder.tensors.keys() == plain.keys()
    assert folder.hf_config["num_nextn_predict_layers"] == 0
    bias = folder.tensors["model.layers.1.mlp.gate.e_score_correction_bias"]
    assert bias.shape == (4,)  # (the file's [1, 4], held on the router)


def test_sparse_layers_it_cannot_say_are_refused_as_it_is_written() -> None:
    raw = {**SIZES, "model_type": "ernie4_5_moe", "num_hidden_layers": 4, "moe_num_experts": 4,
           "moe_k": 2, "moe_intermediate_size": 32, "moe_layer_start_index": 1}
    cfg = config_from_hf(raw, "c.json")
    assert [cfg.is_sparse(i) for i in range(4)] == [False, True, True, True]
    assert config_to_hf(cfg, torch.float32)["moe_layer_end_index"] == 3
    import msgspec

    gappy = msgspec.structs.replace(cfg, mlp_only_layers=(0, 2))
    with pytest.raises(ModelConfigError, match=r"^an ernie4_5_moe checkpoint's sparse layers are "
                       r"every moe_layer_interval-th of one run"):
        config_to_hf(gappy, torch.float32)
