"""Nemotron-H's (``nemotron_h``) tensors on disk <-> as pivotflow holds them.

Its files name the decoder ``backbone`` (``backbone.embeddings``, ``backbone.norm_f``) and each
layer's one block ``mixer`` behind one ``norm``; pivotflow holds a Mamba2 block as
``mamba``, an attention block as ``self_attn`` (each behind ``input_layernorm``) and an MLP
block as ``mlp`` (behind ``post_attention_layernorm``), its embeddings and final norm under
every other family's names. Renames only: no tensor is copied.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from pivotflow.engines.torch.model_config import ModelConfig

_DISK = re.compile(r"(?:backbone|model)\.layers\.(\d+)\.(norm|mixer)\.(.*)")
_HELD = re.compile(r"model\.layers\.(\d+)\.(input_layernorm|post_attention_layernorm|mamba|"
                   r"self_attn|mlp)\.(.*)")
_OUTER = {"embeddings.weight": "model.embed_tokens.weight", "norm_f.weight": "model.norm.weight"}
_OUTER_BACK = {held: f"backbone.{disk}" for disk, held in _OUTER.items()}


def _block(cfg: ModelConfig, layer: int) -> str:
    """The module pivotflow holds layer ``layer``'s block as."""
    if not cfg.has_mixer(layer):
        return "mlp"
    return "mamba" if cfg.is_linear(layer) else "self_attn"


def nemotron_split(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Nemotron-H folder's tensors (``backbone.``, or transformers 5's ``model.`` in memory)
    under pivotflow's names."""
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        prefix, _, rest = name.partition(".")
        m = _DISK.fullmatch(name)
        if m is not None:
            i = int(m.group(1))
            norm = "input_layernorm" if cfg.has_mixer(i) else "post_attention_layernorm"
            inner = norm if m.group(2) == "norm" else _block(cfg, i)
            out[f"model.layers.{i}.{inner}.{m.group(3)}"] = t
        elif prefix in ("backbone", "model") and rest in _OUTER:
            out[_OUTER[rest]] = t
        else:
            out[name] = t
    return out


def nemotron_disk(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Held tensors under Nemotron-H's file names (what transformers and vLLM read)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        m = _HELD.fullmatch(name)
        if m is not None:
            inner = "norm" if m.group(2).endswith("layernorm") else "mixer"
            out[f"backbone.layers.{m.group(1)}.{inner}.{m.group(3)}"] = t
        else:
            out[_OUTER_BACK.get(name, name)] = t
    return out


def nemotron_adapters(adapters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """LoRA adapters (``<layer>.lora_A``/``.lora_B`` under pivotflow's names) under the
    modules transformers holds in memory (``model.layers.N.mixer.*``), which PEFT adapts."""
    out: dict[str, torch.Tensor] = {}
    for name, t in adapters.items():
        m = _HELD.fullmatch(name)
        out[f"model.layers.{m.group(1)}.mixer.{m.group(3)}" if m else name] = t
    return out
