"""Gemma 4's experts beside its MLP (gemma-4-26B-A4B) as pivotflow holds them, and back.

Its file keeps a layer's router and experts on the layer itself: ``layers.N.router.proj``
(the projection), ``router.scale`` and ``router.per_expert_scale``, and the experts stacked
output-major as transformers' module holds them, ``experts.gate_up_proj`` [E, 2I, H] and
``experts.down_proj`` [E, H, I]. pivotflow holds them as a sparse block beside the MLP,
``layers.N.moe``: the router as ``moe.gate`` (its scales on it), each expert's projections
its own linears (``moe.experts.E.gate_proj.weight``...), as every other MoE's. Engines are sent
the file's names with the experts one at a time (vLLM's loader reads either); the file, and a
checkpoint, get them stacked again.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pivotflow.params.stacked_experts import split_stacks, stacked

if TYPE_CHECKING:
    import torch

    from pivotflow.engines.torch.model_config import ModelConfig

# the file's router tensors: the held ones
_ROUTER = {"router.proj.weight": "moe.gate.weight", "router.scale": "moe.gate.scale",
           "router.per_expert_scale": "moe.gate.per_expert_scale"}
_ROUTER_BACK = {held: disk for disk, held in _ROUTER.items()}
_ON_DISK = re.compile(r"(.*layers\.\d+\.)(router\..*|experts\..*)")
_HELD = re.compile(r"(.*layers\.\d+\.)moe\.(gate\..*|experts\..*)")


def gemma4_held(cfg: ModelConfig, tensors: dict[str, torch.Tensor],
                where: str) -> dict[str, torch.Tensor]:
    """A Gemma 4 file's tensors as pivotflow holds them (views of the file's stacks). Raises
    ModelConfigError naming ``where`` and the stack whose shape the config does not give."""
    renamed = {}
    for name, t in tensors.items():
        m = _ON_DISK.fullmatch(name)
        renamed[name if m is None else m.group(1) + _ROUTER.get(m.group(2),
                                                                 "moe." + m.group(2))] = t
    return split_stacks(cfg, renamed, where, either_way=False)


def gemma4_engine(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Held tensors under the file's names, each expert's projections apart (what an engine's
    loader is sent)."""
    out = {}
    for name, t in tensors.items():
        m = _HELD.fullmatch(name)
        if m is None:
            out[name] = t
            continue
        rest = m.group(2)
        out[m.group(1) + (_ROUTER_BACK.get("moe." + rest) or rest)] = t
    return out


def gemma4_disk(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Held tensors as the file holds them: the file's names, each layer's experts stacked."""
    return gemma4_engine(stacked(tensors))
