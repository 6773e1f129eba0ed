"""A Hugging Face model folder as the parameter store sees it: ``config.json`` (kept as data) and
safetensors weights, read and written without knowing the architecture, but for the families
whose files lay tensors out otherwise than pivotflow holds them (``hf_layout``: Phi-3's fused
projections, Mixtral's names).

Used wherever weights leave or enter the store as files: the directory backend, run checkpoints,
and the export an engine that loads by path (vLLM, SGLang) reads. Whether an engine can run the
model is that engine's question (the torch engine's ``config_from_hf`` and ``check_tensors``);
here a folder only has to be readable and whole.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pivotflow.errors import CheckpointError
from pivotflow.params.held_config import held_config
from pivotflow.params.hf_layout import disk_layout, held_layout

if TYPE_CHECKING:
    import torch

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
# PyTorch's pickled weights, as older folders carry them (read only: pivotflow writes
# safetensors), loaded with torch.load(weights_only=True) so a file can hold tensors but no code
PICKLED_WEIGHTS = "pytorch_model.bin"
PICKLED_INDEX = "pytorch_model.bin.index.json"
WEIGHT_FILES = (WEIGHTS, SHARD_INDEX, PICKLED_WEIGHTS, PICKLED_INDEX)  # in the order read
# What a model folder carries besides config and weights, so a copy of it still loads with
# transformers' AutoTokenizer and keeps its stop tokens (generation_config.json's eos ids).
SIDE_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "generation_config.json",
)
SIDE_DIRS = ("additional_chat_templates",)  # transformers 5 keeps named chat templates here


def read_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A JSON object file of a model folder; raises CheckpointError naming the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_config(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """``config.json`` of a model folder as a dict; raises CheckpointError naming the file."""
    return read_json(Path(directory) / CONFIG)


def read_folder(
    directory: str | os.PathLike[str],
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config dict, tensors as pivotflow holds them: ``hf_layout.held_layout``) of a model
    folder (``read_weights``). Raises CheckpointError naming a missing or unreadable file,
    ModelConfigError for a fused tensor that does not split as the config says."""
    config = read_config(directory)
    tensors, where = read_weights(directory)
    return held_config(config, str(Path(directory) / CONFIG)), held_layout(config, tensors,
                                                                          str(where))


def read_weights(directory: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], Path]:
    """(tensors, the file they came from) of ``model.safetensors``, or of the shards that
    ``model.safetensors.index.json`` lists, checked against its weight_map; else of
    ``pytorch_model.bin`` or its index's shards (``WEIGHT_FILES``' order: what transformers
    prefers). Raises CheckpointError naming a missing or unreadable file, or the shard or
    tensor the index names that is not there."""
    root = Path(directory)
    present = [name for name in WEIGHT_FILES if (root / name).exists()]
    if not present:
        raise CheckpointError(f"{root}: no {' or '.join(WEIGHT_FILES)}")
    single, index = root / present[0], root / present[0]
    if not present[0].endswith(".index.json"):
        return _read_tensors(single), single
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: weight_map is missing or empty")
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(map(str, weight_map.values()))):
        path = root / shard
        if Path(shard).name != shard:  # shards live next to the index
            raise CheckpointError(f"{index}: weight_map names shard {shard!r}, not a file there")
        if not path.is_file():
            raise CheckpointError(f"{index}: weight_map names shard {shard!r}, but {path} is "
                                  "missing")
        tensors.update(_read_tensors(path))
    for name, shard in weight_map.items():
        if name not in tensors:
            raise CheckpointError(
                f"{index}: weight_map puts tensor {name!r} in {shard!r}, which does not hold it"
            )
    return tensors, index


def _read_pickled(path: Path) -> dict[str, torch.Tensor]:
    """A ``pytorch_model.bin``'s tensors, through torch.load's weights_only unpickler (tensors,
    dicts and numbers load; any other object, code included, is refused), memory-mapped where
    the file's format allows."""
    import torch

    try:
        try:
            data = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:  # (a file in torch's legacy format cannot be mapped)
            if "mmap" not in str(exc):
                raise
            data = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # the unpickler's refusal, a truncated zip, a bad magic number
        raise CheckpointError(f"{path}: cannot read PyTorch weights (read with weights_only, "
                              f"which runs no code): {_torch_load_reason(str(exc))}") from None
    if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in data.items()):
        raise CheckpointError(f"{path}: not a state dict (a mapping of names to tensors)")
    return data


def _torch_load_reason(message: str) -> str:
    """torch.load's error in a few words: its unpickler's reason where it gives one (the rest
    of its message is advice on loading the file unsafely, which pivotflow never does)."""
    reason = message.split("WeightsUnpickler error:", 1)[-1]
    reason = re.sub(r"\x1b\[[0-9;]*m", "", reason).split(". ")[0]
    return " ".join(reason.split())[:200]


def write_folder(
    directory: str | os.PathLike[str],
    config: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    *,
    side_files_from: str | os.PathLike[str] | None = None,
) -> None:
    """Write ``config`` as ``config.json`` and ``tensors`` (their dtypes; their names as the
    family stores them, ``hf_layout.disk_layout``) as ``model.safetensors``, each through a
    temporary name so a reader never sees half a file;
    then copy the tokenizer and generation files ``side_files_from`` has (SIDE_FILES). A tensor
    that shares storage with an earlier one (a tied head, a view) is written as its own copy:
    safetensors refuses shared storage, and a loader that ties the weights ignores the
    duplicate. Raises
    CheckpointError if the files cannot be written."""
    from safetensors.torch import save_file

    root = Path(directory)
    seen: set[int] = set()
    flat: dict[str, torch.Tensor] = {}
    for name, t in disk_layout(config, tensors).items():
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        flat[name] = t.clone() if ptr in seen else t
        if t.numel():
            seen.add(ptr)
    try:
        root.mkdir(parents=True, exist_ok=True)
        save_file(flat, str(root / f"{WEIGHTS}.tmp"), metadata={"format": "pt"})
        (root / f"{CONFIG}.tmp").write_text(json.dumps(config, indent=2) + "\n")
        os.replace(root / f"{WEIGHTS}.tmp", root / WEIGHTS)
        os.replace(root / f"{CONFIG}.tmp", root / CONFIG)
        if side_files_from is not None:
            copy_side_files(side_files_from, root)
    except (OSError, ValueError, RuntimeError) as exc:  # safetensors raises the latter two
        raise CheckpointError(f"{root}: cannot write model folder: {exc}") from exc


def copy_side_files(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> list[str]:
    """Copy the SIDE_FILES (and SIDE_DIRS) that ``src`` has into ``dst``; returns their names."""
    copied = []
    for name in SIDE_FILES:
        if (Path(src) / name).is_file():
            shutil.copyfile(Path(src) / name, Path(dst) / name)
            copied.append(name)
    for name in SIDE_DIRS:
        if (Path(src) / name).is_dir():
            shutil.copytree(Path(src) / name, Path(dst) / name, dirs_exist_ok=True)
            copied.append(name)
    return copied


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if path.suffix == ".bin":
        return _read_pickled(path)
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for bad headers
        why = " ".join(str(exc).split())  # one line, whatever the library said
        raise CheckpointError(f"{path}: cannot read safetensors file: {why}") from exc
