"""Llama 4's text decoder (``llama4_text``) as pivotflow holds it, and back.

Its file names each layer's feed-forward ``feed_forward`` (a dense layer's ``gate_proj``...,
a sparse one's ``router``, ``shared_expert`` and experts) and stacks a sparse layer's experts
input-major, as transformers' module holds them: ``feed_forward.experts.gate_up_proj``
[E, H, 2I] (each expert's gate columns, then its up ones) and ``experts.down_proj`` [E, I, H].
pivotflow holds them under every other family's names: ``mlp``, the router ``mlp.gate``, the
shared expert ``mlp.shared_experts``, each expert's projections its own linears
(``mlp.experts.E.gate_proj.weight`` [I, H]...). Its rope turns interleaved pairs: each head's
q and k rows are held reordered (``renamed_layout.turn_heads``). Engines are sent the file's
names and row order with the experts one at a time (vLLM's loader reads either); the file,
and a checkpoint, get them stacked again.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pivotflow.params.renamed_layout import turn_heads, turned_adapters
from pivotflow.params.stacked_experts import split_stacks, stacked

if TYPE_CHECKING:
    import torch

    from pivotflow.engines.torch.model_config import ModelConfig

# the file's feed-forward modules under a layer's ``feed_forward.``: the held ones under ``mlp.``
_RENAMED = (("router.", "gate."), ("shared_expert.", "shared_experts."))
_ON_DISK = re.compile(r"(.*layers\.\d+\.)feed_forward\.(.*)")
_HELD = re.compile(r"(.*layers\.\d+\.)mlp\.(.*)")


def llama4_held(cfg: ModelConfig, tensors: dict[str, torch.Tensor],
                where: str) -> dict[str, torch.Tensor]:
    """A Llama 4 file's tensors as pivotflow holds them. Raises ModelConfigError naming
    ``where`` and the stack whose shape the config does not give."""
    renamed = _moved(tensors, _ON_DISK, "mlp.", _RENAMED)
    held = split_stacks(cfg, renamed, where, input_major=True)
    return turn_heads(cfg, held, where, to_disk=False)


def _moved(tensors: dict[str, torch.Tensor], module: re.Pattern[str], into: str,
           renames: tuple[tuple[str, str], ...]) -> dict[str, torch.Tensor]:
    """``tensors`` with each of a layer's ``module`` tensors moved ``into`` the other one's
    name, its sub-modules renamed by ``renames`` (from, to)."""
    out = {}
    for name, t in tensors.items():
        m = module.fullmatch(name)
        if m is None:
            out[name] = t
            continue
        rest = m.group(2)
        for old, new in renames:
            if rest.startswith(old):
                rest = new + rest[len(old):]
        out[m.group(1) + into + rest] = t
    return out


def llama4_engine(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Held tensors under the file's names and q/k row order, each expert's projections
    apart (what an engine's loader is sent)."""
    return _file_names(turn_heads(cfg, tensors, "engine export", to_disk=True))


def llama4_adapters(cfg: ModelConfig, adapters: dict[str, torch.Tensor]
                    ) -> dict[str, torch.Tensor]:
    """LoRA adapters of held modules as adapters of the file's (q's and k's B rows in its
    interleaved order, the feed-forward's modules under its names)."""
    return _file_names(turned_adapters(cfg, adapters))


def _file_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return _moved(tensors, _HELD, "feed_forward.",
                  tuple((held, disk) for disk, held in _RENAMED))


def llama4_disk(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Held tensors as the file holds them: its names, each layer's experts stacked
    input-major."""
    return llama4_engine(cfg, stacked(tensors, input_major=True))
