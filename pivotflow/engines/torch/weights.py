"""Model folders in Hugging Face layout, and tensor-set checks.

A folder is ``config.json``, ``model.safetensors`` or the shards ``model.safetensors.index.json``
lists, and optionally ``generation_config.json``. One written by ``save_checkpoint`` loads with
``transformers.AutoModelForCausalLM.from_pretrained``; one written by transformers'
``save_pretrained`` for a model of any family ``config_from_hf`` reads loads with
``load_model_folder``.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from pivotflow.engines.torch.hf_config import config_from_hf, config_to_hf, resolve_dtype
from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.errors import CheckpointError, ModelConfigError
from pivotflow.params.held_config import config_where, held_config
from pivotflow.params.hf_folder import read_json, read_weights
from pivotflow.params.hf_layout import disk_layout, held_layout

__all__ = [
    "ModelFolder",
    "build_model",
    "check_tensors",
    "config_from_hf",
    "config_to_hf",
    "expected_shapes",
    "load_checkpoint",
    "load_model_folder",
    "resolve_dtype",
    "save_checkpoint",
]
_OPTIONAL_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old exports carry; recomputed here


@functools.lru_cache(maxsize=16)
def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape for ``cfg`` (without ``lm_head.weight`` when embeddings are tied)."""
    with torch.device("meta"):
        ref = Decoder(cfg)
    return {name: tuple(p.shape) for name, p in ref.named_parameters()}


def check_tensors(cfg: ModelConfig, tensors: dict[str, torch.Tensor], where: str) -> None:
    """Raise ModelConfigError naming ``where`` and the tensor if ``tensors`` do not fit ``cfg``:
    a missing, unexpected, non-float or wrongly shaped tensor."""
    expected = dict(expected_shapes(cfg))
    if cfg.tie_word_embeddings and not cfg.num_labels:  # tied: the head may be repeated
        expected.setdefault("lm_head.weight", (cfg.vocab_size, cfg.hidden_size))
    for name, tensor in tensors.items():
        if name.endswith(_OPTIONAL_SUFFIXES):
            continue
        shape = expected.get(name)
        if shape is None:
            raise ModelConfigError(
                f"{where}: unexpected tensor {name!r}; a {cfg.architecture} model with "
                f"{cfg.num_hidden_layers} layers has no such parameter"
            )
        if tuple(tensor.shape) != shape:
            raise ModelConfigError(
                f"{where}: tensor {name!r} has shape {tuple(tensor.shape)}, the config needs {shape}"
            )
        if not tensor.is_floating_point():
            raise ModelConfigError(f"{where}: tensor {name!r} has dtype {tensor.dtype}, not float")
    for name in expected_shapes(cfg):
        if name not in tensors:
            raise ModelConfigError(f"{where}: tensor {name!r} is missing")


def build_model(
    cfg: ModelConfig,
    tensors: dict[str, torch.Tensor],
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str = torch.float32,
    model: Decoder | None = None,
) -> Decoder:
    """Copy checked ``tensors`` (any float dtype; cast on copy) into ``model`` (or a new one in
    ``dtype`` on ``device``, built without random init) and return it. ``dtype`` may be a name
    (``resolve_dtype``'s). Raises ModelConfigError naming a tensor that does not fit."""
    check_tensors(cfg, tensors, "load_weights")
    if isinstance(dtype, str):
        dtype = resolve_dtype({}, dtype)
    if model is None:
        with torch.device("meta"):
            model = Decoder(cfg)
        model = model.to_empty(device=device).to(dtype).eval()
        if cfg.tie_word_embeddings and not cfg.num_labels:  # to_empty unties them: re-tie
            model.lm_head.weight = model.model.embed_tokens.weight
        model.keep_sigmoid_routers_float32()
        model.requires_grad_(False)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(tensors[name])
    return model


@dataclass(frozen=True)
class ModelFolder:
    """What ``load_model_folder`` read: ``hf_config`` is config.json as read (as it describes
    the tensors held: ``hf_layout.held_config``), ``config`` its
    ModelConfig, ``tensors`` the weights as stored (HF names, stored dtype), and ``eos_ids`` the
    token ids that end a generation."""

    hf_config: dict[str, Any]
    config: ModelConfig
    tensors: dict[str, torch.Tensor]
    generation_config: dict[str, Any]
    eos_ids: tuple[int, ...]


def _eos_ids(generation: dict[str, Any], hf_config: dict[str, Any], root: Path) -> tuple[int, ...]:
    """generation_config.json's eos_token_id (int or list); transformers falls back on
    config.json's when the generation config has none, and so do we."""
    where, value = root / "generation_config.json", generation.get("eos_token_id")
    if value is None:
        where, value = root / "config.json", hf_config.get("eos_token_id")
    if value is None:
        return ()
    ids = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ModelConfigError(
            f"{where}: eos_token_id={value!r} is not a token id or a list of token ids"
        )
    return tuple(dict.fromkeys(ids))  # unique, in order


def load_model_folder(directory: str | os.PathLike[str]) -> ModelFolder:
    """Read a Hugging Face model folder: config.json, model.safetensors (or the shards
    model.safetensors.index.json lists; else pytorch_model.bin or its shards, read with
    torch.load's weights_only: ``hf_folder.read_weights``) and generation_config.json when
    there is one.

    Raises CheckpointError naming a missing or unreadable file (or shard, or a tensor the index
    lists that no shard holds), ModelConfigError naming the file and key the engine cannot run
    or the tensor that does not fit the config.
    """
    root = Path(directory)
    config_path = root / "config.json"
    raw = read_json(config_path)
    hf_config = held_config(raw, str(config_path))
    cfg = config_from_hf(hf_config, config_where(raw, str(config_path)))
    gen_path = root / "generation_config.json"
    generation = read_json(gen_path) if gen_path.exists() else {}
    tensors, where = read_weights(root)
    tensors = held_layout(raw, tensors, str(where))
    check_tensors(cfg, tensors, str(where))
    return ModelFolder(hf_config, cfg, tensors, generation,
                       _eos_ids(generation, hf_config, root))


def load_checkpoint(
    directory: str | os.PathLike[str],
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """``load_model_folder``'s (config, tensors), for callers that need only those."""
    folder = load_model_folder(directory)
    return folder.config, folder.tensors


def _for_saving(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor safetensors can write: a view into a larger (packed) storage is copied,
    because safetensors refuses tensors that share memory."""
    t = t.detach().to("cpu").contiguous()
    return t.clone() if t.untyped_storage().nbytes() != t.nbytes else t


def save_checkpoint(
    directory: str | os.PathLike[str],
    config: ModelConfig | dict[str, Any],
    tensors: dict[str, torch.Tensor],
    generation_config: dict[str, Any] | None = None,
) -> None:
    """Write config.json, model.safetensors and (when given) generation_config.json, which
    transformers and ``load_model_folder`` read.

    ``config`` is a ModelConfig (written as ``config_to_hf`` maps it) or a Hugging Face config
    dict, written verbatim but for ``torch_dtype``/``dtype``, set to the tensors' dtype, so a
    user's config round-trips with all its keys. Raises ModelConfigError if ``tensors`` do not
    fit the config (or it cannot be expressed as a transformers model), CheckpointError if the
    files cannot be written.
    """
    cfg = (
        config
        if isinstance(config, ModelConfig)
        else config_from_hf(config, "save_checkpoint config")
    )
    check_tensors(cfg, tensors, "save_checkpoint tensors")
    # Only the parameters: drops a tied lm_head.weight (safetensors forbids aliases).
    out = {name: _for_saving(tensors[name]) for name in expected_shapes(cfg)}
    dtype = out["model.embed_tokens.weight"].dtype
    if isinstance(config, ModelConfig):
        hf_config = config_to_hf(config, dtype)
    else:
        dtype_name = str(dtype).removeprefix("torch.")
        hf_config = {**config, "torch_dtype": dtype_name, "dtype": dtype_name}
    out = disk_layout(hf_config, out)  # (Phi-3's fused projections, Mixtral's names)
    texts = {"config.json": hf_config}
    if generation_config is not None:
        texts["generation_config.json"] = generation_config
    root = Path(directory)
    try:
        root.mkdir(parents=True, exist_ok=True)
        # Write then rename, so a reader never sees half a checkpoint.
        save_file(out, str(root / "model.safetensors.tmp"), metadata={"format": "pt"})
        for name, data in texts.items():
            (root / f"{name}.tmp").write_text(json.dumps(data, indent=2) + "\n")
        os.replace(root / "model.safetensors.tmp", root / "model.safetensors")
        for name in texts:
            os.replace(root / f"{name}.tmp", root / name)
    except (OSError, TypeError, ValueError) as exc:  # TypeError: a value JSON cannot hold
        raise CheckpointError(f"{root}: cannot write checkpoint: {exc}") from exc
