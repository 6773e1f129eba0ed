"""Model folders: what load_model_folder reads (generation config, eos ids, dtype), what
save_checkpoint writes back, and the one-line errors for folders the engine cannot run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_fixtures import CASES, PROMPTS, hf_model, save_folder
from safetensors.torch import load_file, save_file

from pivotflow.engines.base import GenerationRequest, SamplingParams
from pivotflow.engines.torch import (
    TorchEngine,
    config_from_hf,
    load_model_folder,
    resolve_dtype,
    save_checkpoint,
)
from pivotflow.engines.torch.engine import DEFAULT_MAX_SEQ_LEN
from pivotflow.errors import CheckpointError, ModelConfigError

QWEN2, LLAMA, QWEN3 = CASES[1], CASES[2], CASES[5]


def _edit_json(path: Path, **changes: Any) -> None:
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))


def _one_line(exc: pytest.ExceptionInfo[Exception]) -> str:
    message = str(exc.value)
    # (short, for a person: the longest names the file's path and every family the engine runs,
    # 29 of them: about 200 characters of the 500)
    assert "\n" not in message and len(message) < 500, message
    return message


def test_generation_config_eos_ids_are_read_and_fall_back_on_config_json(tmp_path: Path) -> None:
    save_folder(LLAMA, tmp_path)  # transformers writes eos 2 into both files
    _edit_json(tmp_path / "generation_config.json", eos_token_id=[2, 7, 2])
    folder = load_model_folder(tmp_path)
    assert folder.eos_ids == (2, 7) and folder.generation_config["eos_token_id"] == [2, 7, 2]
    assert folder.hf_config["model_type"] == "llama"
    (tmp_path / "generation_config.json").unlink()
    folder = load_model_folder(tmp_path)
    assert folder.generation_config == {} and folder.eos_ids == (2,)
    _edit_json(tmp_path / "config.json", eos_token_id="</s>")
    with pytest.raises(ModelConfigError, match=r"config\.json: eos_token_id='</s>'") as exc:
        load_model_folder(tmp_path)
    _one_line(exc)


def test_every_eos_id_stops_generation(tmp_path: Path) -> None:
    save_folder(QWEN3, tmp_path)
    folder = load_model_folder(tmp_path)
    params = SamplingParams(temperature=0.0, max_tokens=12)
    free = TorchEngine(folder.config)
    free.load_weights(folder.tensors, 0)
    tokens = free.generate([GenerationRequest("a", PROMPTS[2], params)])[0].token_ids
    stop = tokens[3]
    first = tokens.index(stop)  # greedy may reach that token before index 3
    unused = next(t for t in range(300) if t not in tokens)
    engine = TorchEngine(folder.config, eos_token_ids=(unused, stop), eos_token_id=unused)
    assert engine.eos_token_ids == (unused, stop)
    engine.load_weights(folder.tensors, 0)
    out = engine.generate([GenerationRequest("a", PROMPTS[2], params)])[0]
    assert out.token_ids == tokens[: first + 1] and out.finish_reason == "stop"


def test_resolve_dtype() -> None:
    assert resolve_dtype({"torch_dtype": "bfloat16"}, None) == torch.bfloat16
    assert resolve_dtype({"dtype": "float16", "torch_dtype": "float32"}, "auto") == torch.float16
    assert resolve_dtype({}, "auto") == torch.float32
    assert resolve_dtype({"dtype": "bfloat16"}, "fp32") == torch.float32
    assert (
        resolve_dtype({}, "bf16") == torch.bfloat16 and resolve_dtype({}, "fp16") == torch.float16
    )
    with pytest.raises(ModelConfigError, match=r"^dtype='int8' is not one of auto, float32") as e:
        resolve_dtype({}, "int8")
    _one_line(e)
    with pytest.raises(ModelConfigError, match=r"^/p/config\.json: torch_dtype='float64'") as e:
        resolve_dtype({"torch_dtype": "float64"}, None, "/p/config.json")
    _one_line(e)


def test_save_checkpoint_round_trips_a_users_config_and_loads_in_transformers(
    tmp_path: Path,
) -> None:
    transformers = pytest.importorskip("transformers")
    model = save_folder(QWEN2, tmp_path / "src")
    folder = load_model_folder(tmp_path / "src")
    bf16 = {k: v.to(torch.bfloat16) for k, v in folder.tensors.items()}
    generation = {"eos_token_id": [3, 4], "do_sample": True, "temperature": 0.7}
    save_checkpoint(tmp_path / "out", folder.hf_config, bf16, generation)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written == {**folder.hf_config, "dtype": "bfloat16", "torch_dtype": "bfloat16"}
    assert not list((tmp_path / "out").glob("*.tmp"))
    again = load_model_folder(tmp_path / "out")
    assert again.config == folder.config and again.eos_ids == (3, 4)
    assert all(torch.equal(again.tensors[k], v) for k, v in bf16.items())
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert theirs.dtype == torch.bfloat16
    ids = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        ref, got = model(ids).logits, theirs.float()(ids).logits
    torch.testing.assert_close(got, ref, atol=0.1, rtol=0)  # bf16-rounded weights


def test_config_to_hf_writes_qwen3_and_llama3_rope_that_transformers_rebuilds(
    tmp_path: Path,
) -> None:
    transformers = pytest.importorskip("transformers")
    for case in (LLAMA, QWEN3):
        model = hf_model(case)
        folder_dir = tmp_path / case.name
        model.save_pretrained(folder_dir)
        folder = load_model_folder(folder_dir)
        save_checkpoint(tmp_path / f"{case.name}-ours", folder.config, folder.tensors)
        theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / f"{case.name}-ours")
        assert load_model_folder(tmp_path / f"{case.name}-ours").config == folder.config
        ids = torch.tensor([PROMPTS[2] * 10])  # 70 positions: past llama3's original 16
        with torch.no_grad():
            torch.testing.assert_close(theirs(ids).logits, model(ids).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"rope_parameters": {"rope_type": "longrope", "factor": 4.0, "rope_theta": 1e4}},
            r"config\.json: rope_parameters\.rope_type='longrope' is not supported by the "
            r"embedded engine \(default, linear, llama3, yarn; longrope on phi3, proportional "
            r"on gemma4_text\)$",
        ),
        (
            {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
            r"config\.json: rope_scaling\.type='dynamic' is not supported",
        ),
        (
            {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}},
            r"config\.json: rope_parameters\.low_freq_factor is missing",
        ),
        ({"model_type": "gemma3n"}, r"config\.json: model_type='gemma3n' is not supported"),
        ({"model_type": "gemma3"}, r"config\.json: a gemma3 config needs its text model's "
                                   r"config as an object 'text_config', got NoneType$"),
        (
            {"use_sliding_window": True, "sliding_window": -1},
            r"config\.json: sliding_window=-1 is not a positive integer",
        ),
        (
            {"layer_types": ["full_attention", "chunked_attention"]},
            r"config\.json: layer_types=\['full_attention', 'chunked_attention'\] is not",
        ),
        ({"hidden_act": "gelu"}, r"config\.json: hidden_act='gelu' is not supported.*\(silu\)"),
        ({"mlp_bias": True}, r"config\.json: mlp_bias=True is not supported"),
        ({"head_dim": 31}, r"config\.json: head_dim 31 must be even"),
        ({"num_key_value_heads": 3}, r"config\.json: num_attention_heads 4 is not a multiple"),
        ({"hidden_size": "64"}, r"config\.json: hidden_size='64' is not a positive integer"),
        ({"vocab_size": None}, r"config\.json: vocab_size=None is not a positive integer"),
    ],
)
def test_a_config_the_engine_cannot_run_is_a_one_line_error(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    save_folder(QWEN3, tmp_path)
    _edit_json(tmp_path / "config.json", **changes)
    with pytest.raises(ModelConfigError, match=message) as exc:
        load_model_folder(tmp_path)
    assert str(tmp_path / "config.json") in _one_line(exc)


def test_missing_or_partial_shards_are_one_line_errors(tmp_path: Path) -> None:
    save_folder(QWEN3, tmp_path, max_shard_size="50KB")
    index = tmp_path / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    shard = weight_map["model.norm.weight"]
    moved = tmp_path / "elsewhere.bin"
    (tmp_path / shard).rename(moved)
    with pytest.raises(CheckpointError, match=rf"index\.json: weight_map names shard '{shard}'"):
        load_model_folder(tmp_path)
    moved.rename(tmp_path / shard)
    _edit_json(index, weight_map={**weight_map, "model.extra.weight": shard})
    with pytest.raises(CheckpointError, match=r"tensor 'model\.extra\.weight' in .*not hold it"):
        load_model_folder(tmp_path)
    _edit_json(index, weight_map={**weight_map, "model.norm.weight": "../outside.safetensors"})
    with pytest.raises(CheckpointError, match=r"shard '\.\./outside\.safetensors'") as exc:
        load_model_folder(tmp_path)
    _one_line(exc)


def test_wrong_tensor_shape_and_unreadable_files_name_the_file(tmp_path: Path) -> None:
    save_folder(QWEN2, tmp_path)
    weights = tmp_path / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["model.layers.1.self_attn.k_proj.bias"] = torch.zeros(31)
    save_file(tensors, str(weights))
    with pytest.raises(ModelConfigError) as exc:
        load_model_folder(tmp_path)
    assert _one_line(exc) == (
        f"{weights}: tensor 'model.layers.1.self_attn.k_proj.bias' has shape (31,), "
        "the config needs (32,)"
    )
    weights.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: cannot read") as exc:
        load_model_folder(tmp_path)
    _one_line(exc)
    weights.unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors") as exc:
        load_model_folder(tmp_path)
    _one_line(exc)


def test_config_from_hf_keeps_the_rope_theta_of_old_configs() -> None:
    raw = {
        "model_type": "qwen2",
        "vocab_size": 300,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 128,
        "rope_theta": 1e6,
        "rope_scaling": None,
        "sliding_window": 4096,
        "use_sliding_window": False,
        "max_window_layers": 21,
    }  # fmt: skip  (a Qwen2.5 config.json as transformers 4 wrote it)
    cfg = config_from_hf(raw, "c.json")
    assert (cfg.rope_theta, cfg.rope_type, cfg.head_dim, cfg.num_key_value_heads) == (
        1e6, "default", 32, 2
    )  # fmt: skip
    assert cfg.attention_bias and not cfg.tie_word_embeddings and not cfg.qk_norm


def test_a_long_context_model_gets_a_bounded_default_context(tmp_path: Path) -> None:
    save_folder(QWEN2, tmp_path)
    _edit_json(tmp_path / "config.json", max_position_embeddings=32768)
    cfg = load_model_folder(tmp_path).config
    assert TorchEngine(cfg, max_batch=1).max_seq_len == DEFAULT_MAX_SEQ_LEN
    assert TorchEngine(cfg, max_batch=1, max_seq_len=8192).max_seq_len == 8192


@pytest.mark.parametrize("sharded", [False, True], ids=["one-file", "sharded"])
def test_a_folder_of_pytorch_model_bin_loads_as_its_safetensors_would(
        tmp_path: Path, sharded: bool) -> None:
    """Older folders carry pickled weights (pytorch_model.bin, or shards and the index
    transformers 4 wrote for them): read with torch.load's weights_only, the same tensors as
    the safetensors file, and a checkpoint of them is safetensors again."""
    save_folder(QWEN2, tmp_path / "safe")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    for name in ("config.json", "generation_config.json"):
        (pickled / name).write_bytes((tmp_path / "safe" / name).read_bytes())
    tensors = load_file(str(tmp_path / "safe" / "model.safetensors"))
    if sharded:  # (transformers 4's names and index)
        names = sorted(tensors)
        halves = {"pytorch_model-00001-of-00002.bin": names[::2],
                  "pytorch_model-00002-of-00002.bin": names[1::2]}
        for shard, part in halves.items():
            torch.save({n: tensors[n] for n in part}, pickled / shard)
        weight_map = {n: shard for shard, part in halves.items() for n in part}
        (pickled / "pytorch_model.bin.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map}))
    else:
        torch.save(tensors, pickled / "pytorch_model.bin")
    safe, ours = load_model_folder(tmp_path / "safe"), load_model_folder(pickled)
    assert ours.config == safe.config and ours.tensors.keys() == safe.tensors.keys()
    for name, tensor in safe.tensors.items():
        assert torch.equal(ours.tensors[name], tensor), name
    save_checkpoint(tmp_path / "written", ours.config, ours.tensors)
    assert load_model_folder(tmp_path / "written").config == safe.config


class _Payload:
    """What a malicious pickle would carry: unpickling it runs code (here: it makes a file)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Path.touch, (Path(self.marker),))


def test_a_pickle_that_holds_more_than_tensors_is_refused_and_runs_nothing(
        tmp_path: Path) -> None:
    save_folder(QWEN2, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    marker = tmp_path / "code-ran"
    torch.save({**tensors, "extra": _Payload(str(marker))}, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: cannot read PyTorch weights "
                       r"\(read with weights_only, which runs no code\): ") as exc:
        load_model_folder(tmp_path)
    _one_line(exc)
    assert not marker.exists()
    torch.save([tensors["model.norm.weight"]], tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: not a state dict") as exc:
        load_model_folder(tmp_path)
    (tmp_path / "pytorch_model.bin").unlink()
    with pytest.raises(CheckpointError, match=r": no model\.safetensors or "
                       r"model\.safetensors\.index\.json or pytorch_model\.bin or "
                       r"pytorch_model\.bin\.index\.json$") as exc:
        load_model_folder(tmp_path)
