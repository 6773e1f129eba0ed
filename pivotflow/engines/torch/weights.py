"""Weights in Hugging Face layout: ``config.json`` + ``model.safetensors``, and tensor-set checks.

A directory written by ``save_checkpoint`` loads with ``transformers.AutoModelForCausalLM
.from_pretrained``; one written by ``save_pretrained(safe_serialization=True)`` for a Qwen2 or Llama
model loads with ``load_checkpoint``.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.errors import CheckpointError, ModelConfigError

_ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
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
    if cfg.tie_word_embeddings:  # tied checkpoints may or may not repeat the head
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
    device: torch.device | str,
    dtype: torch.dtype,
    model: Decoder | None = None,
) -> Decoder:
    """Copy checked ``tensors`` into ``model`` (or a new one, built without random init) and
    return it. Raises ModelConfigError naming a tensor that does not fit."""
    check_tensors(cfg, tensors, "load_weights")
    if model is None:
        with torch.device("meta"):
            model = Decoder(cfg)
        model = model.to_empty(device=device).to(dtype).eval()
        if cfg.tie_word_embeddings:  # to_empty gives each module its own tensor; re-tie
            model.lm_head.weight = model.model.embed_tokens.weight
        model.requires_grad_(False)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(tensors[name])
    return model


def config_from_hf(raw: dict[str, Any], where: str) -> ModelConfig:
    """Map a Hugging Face Qwen2/Llama ``config.json`` onto ModelConfig. Raises ModelConfigError
    for a missing field or a feature this decoder does not have (rope scaling, biased MLP...)."""
    kind = raw.get("model_type")
    if kind not in _ARCHITECTURES:
        archs = raw.get("architectures") or []
        kind = next((k for k, a in _ARCHITECTURES.items() if a in archs), kind)
    if kind not in _ARCHITECTURES:
        raise ModelConfigError(
            f"{where}: model_type {kind!r} is not one of {sorted(_ARCHITECTURES)}"
        )
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ModelConfigError(f"{where}: rope type {rope.get('rope_type')!r} is not supported")
    unsupported = {
        "hidden_act": raw.get("hidden_act", "silu") != "silu",
        "mlp_bias": bool(raw.get("mlp_bias", False)),
        "use_sliding_window": bool(raw.get("use_sliding_window", False)),
    }
    for key, bad in unsupported.items():
        if bad:
            raise ModelConfigError(f"{where}: {key}={raw.get(key)!r} is not supported")
    try:
        fields: dict[str, Any] = {
            k: raw[k]
            for k in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "max_position_embeddings",
            )
        }
    except KeyError as exc:
        raise ModelConfigError(f"{where}: required field {exc.args[0]!r} is missing") from None
    heads = fields["num_attention_heads"]
    cfg = ModelConfig(
        **fields,
        num_key_value_heads=raw.get("num_key_value_heads") or heads,
        rope_theta=float(raw.get("rope_theta", rope.get("rope_theta", 10000.0))),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        # Qwen2 always has q/k/v biases; Llama has them only when the config says so.
        attention_bias=True if kind == "qwen2" else bool(raw.get("attention_bias", False)),
        architecture=kind,
    ).validate()
    head_dim = raw.get("head_dim")
    if head_dim is not None and head_dim != cfg.head_dim:
        raise ModelConfigError(
            f"{where}: head_dim {head_dim} differs from hidden_size/num_attention_heads "
            f"{cfg.head_dim}, which this decoder requires"
        )
    return cfg


def config_to_hf(cfg: ModelConfig, dtype: torch.dtype) -> dict[str, Any]:
    """The ``config.json`` transformers needs to rebuild ``cfg``."""
    if cfg.architecture not in _ARCHITECTURES:
        raise ModelConfigError(
            f"architecture {cfg.architecture!r} is not one of {sorted(_ARCHITECTURES)}"
        )
    if cfg.architecture == "qwen2" and not cfg.attention_bias:
        raise ModelConfigError(
            "a qwen2 checkpoint always has q/k/v biases; use architecture='llama' for a model "
            "with attention_bias=False"
        )
    dtype_name = str(dtype).removeprefix("torch.")
    out: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[cfg.architecture]],
        "model_type": cfg.architecture,
        **{
            f: getattr(cfg, f)
            for f in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "max_position_embeddings",
                "rms_norm_eps",
                "tie_word_embeddings",
            )
        },
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        # transformers 4.x reads rope_theta, 5.x reads rope_parameters: write both.
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "torch_dtype": dtype_name,
        "dtype": dtype_name,
        "use_cache": True,
    }
    if cfg.architecture == "llama":
        out.update(attention_bias=cfg.attention_bias, mlp_bias=False)
    else:
        out.update(use_sliding_window=False, sliding_window=None)
    return out


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for bad headers
        raise CheckpointError(f"{path}: cannot read safetensors file: {exc}") from exc


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def load_checkpoint(
    directory: str | os.PathLike[str],
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read ``config.json`` and ``model.safetensors`` (or the shards its index lists).

    Raises CheckpointError naming a missing or unreadable file, ModelConfigError naming the file
    and tensor when the tensors do not match the config.
    """
    root = Path(directory)
    cfg = config_from_hf(_read_json(root / "config.json"), str(root / "config.json"))
    single, index = root / "model.safetensors", root / "model.safetensors.index.json"
    if single.exists() or not index.exists():
        tensors, where = _read_tensors(single), single
    else:
        weight_map = _read_json(index).get("weight_map", {})
        tensors, where = {}, index
        for shard in sorted(set(weight_map.values())):
            tensors.update(_read_tensors(root / shard))
    check_tensors(cfg, tensors, str(where))
    return cfg, tensors


def save_checkpoint(
    directory: str | os.PathLike[str], config: ModelConfig, state_dict: dict[str, torch.Tensor]
) -> None:
    """Write ``config.json`` and ``model.safetensors`` that transformers and load_checkpoint read.

    Raises ModelConfigError if ``state_dict`` does not fit ``config`` (or the config cannot be
    expressed as a transformers model), CheckpointError if the files cannot be written.
    """
    check_tensors(config, state_dict, "save_checkpoint state_dict")
    tensors = {
        name: t.detach().to("cpu").contiguous()
        for name, t in state_dict.items()
        if name
        in expected_shapes(config)  # drops a tied lm_head.weight (safetensors forbids aliases)
    }
    dtype = tensors["model.embed_tokens.weight"].dtype
    hf_config = config_to_hf(config, dtype)
    root = Path(directory)
    try:
        root.mkdir(parents=True, exist_ok=True)
        # Write then rename, so a reader never sees half a checkpoint.
        save_file(tensors, str(root / "model.safetensors.tmp"), metadata={"format": "pt"})
        (root / "config.json.tmp").write_text(json.dumps(hf_config, indent=2) + "\n")
        os.replace(root / "model.safetensors.tmp", root / "model.safetensors")
        os.replace(root / "config.json.tmp", root / "config.json")
    except OSError as exc:
        raise CheckpointError(f"{root}: cannot write checkpoint: {exc}") from exc
