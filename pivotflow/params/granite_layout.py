"""Granite 4.0's (``granitemoehybrid``) tensors on disk <-> as pivotflow holds them, and Granite
3's MoE's (``granitemoe``, ``granitemoeshared``), laid out alike.

Its files fuse each layer's MLPs: ``shared_mlp.input_linear`` [2I, H] (gate rows, then up)
and ``shared_mlp.output_linear``; with experts, ``block_sparse_moe.input_linear`` [E, 2I, H],
``block_sparse_moe.output_linear`` [E, H, I] and the router ``block_sparse_moe.router.layer``
(transformers 5 names them ``experts.gate_up_proj``, ``experts.down_proj`` and
``router.weight`` in memory; both are read). pivotflow holds a dense layer's shared MLP as its
``mlp.gate_proj``/``up_proj``/``down_proj``, a sparse layer's as ``mlp.shared_experts.*``
beside ``mlp.gate`` and ``mlp.experts.E.*_proj``: views of the file's tensors, no copy.
vLLM's loader reads experts one at a time under ``block_sparse_moe.experts.E.*_proj`` (no
copy either) and the shared MLP fused.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pivotflow.errors import ModelConfigError

if TYPE_CHECKING:
    import torch

_LAYER = re.compile(r"(model\.layers\.\d+\.)(.*)")
_SHARED_IN, _SHARED_OUT = "shared_mlp.input_linear.weight", "shared_mlp.output_linear.weight"
_EXPERTS_IN = ("block_sparse_moe.input_linear.weight", "block_sparse_moe.experts.gate_up_proj")
_EXPERTS_OUT = ("block_sparse_moe.output_linear.weight", "block_sparse_moe.experts.down_proj")
_ROUTER = ("block_sparse_moe.router.layer.weight", "block_sparse_moe.router.weight")
_HELD_EXPERT = re.compile(r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")


def _halves(t: torch.Tensor, name: str, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A fused gate/up tensor's gate and up rows (its last-but-one axis, cut in two)."""
    if t.dim() < 2 or t.shape[-2] % 2:
        raise ModelConfigError(f"{where}: tensor {name!r} has shape {tuple(t.shape)}, which "
                               "does not split into gate and up rows")
    gate, up = t.chunk(2, dim=-2)
    return gate, up


def granite_split(tensors: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """A Granite 4.0 folder's tensors as pivotflow holds them (views)."""
    sparse = {m.group(1) for name in tensors if (m := _LAYER.fullmatch(name))
              and m.group(2) in _ROUTER}
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        m = _LAYER.fullmatch(name)
        if m is None:
            out[name] = t
            continue
        layer, inner = m.groups()
        mlp = f"{layer}mlp.shared_experts." if layer in sparse else f"{layer}mlp."
        if inner == _SHARED_IN:
            out[f"{mlp}gate_proj.weight"], out[f"{mlp}up_proj.weight"] = _halves(t, name, where)
        elif inner == _SHARED_OUT:
            out[f"{mlp}down_proj.weight"] = t
        elif inner in _ROUTER:
            out[f"{layer}mlp.gate.weight"] = t
        elif inner in _EXPERTS_IN:
            gates, ups = _halves(t, name, where)
            for e in range(t.shape[0]):
                out[f"{layer}mlp.experts.{e}.gate_proj.weight"] = gates[e]
                out[f"{layer}mlp.experts.{e}.up_proj.weight"] = ups[e]
        elif inner in _EXPERTS_OUT:
            for e in range(t.shape[0]):
                out[f"{layer}mlp.experts.{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    return out


def granite_engine(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Held tensors as vLLM's Granite 4.0 loader reads them: experts one at a time under
    ``block_sparse_moe.experts.E``, the router under its file name, the shared MLP's gate and
    up fused (``input_linear``), everything else as it is."""
    return _fused(tensors, stack_experts=False)


def granite_fused(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Held tensors as Granite 4.0's files store them (the experts stacked)."""
    return _fused(tensors, stack_experts=True)


def _fused(tensors: dict[str, torch.Tensor], stack_experts: bool) -> dict[str, torch.Tensor]:
    import torch

    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[tuple[str, int], torch.Tensor]] = {}
    for name, t in tensors.items():
        m = _LAYER.fullmatch(name)
        inner = "" if m is None else m.group(2)
        mlp = re.fullmatch(r"mlp\.(shared_experts\.)?(gate|up|down)_proj\.weight", inner)
        expert = _HELD_EXPERT.fullmatch(inner)
        if m is None:
            out[name] = t
        elif mlp is not None:
            partner = (name.replace("up_proj", "gate_proj") if mlp.group(2) == "up"
                       else name.replace("gate_proj", "up_proj"))
            if mlp.group(2) == "down":
                out[m.group(1) + _SHARED_OUT] = t
            elif partner not in tensors:  # (one of the two alone: kept split)
                out[name] = t
            elif mlp.group(2) == "gate":
                out[m.group(1) + _SHARED_IN] = torch.cat((t, tensors[partner]))
        elif inner == "mlp.gate.weight":
            out[m.group(1) + _ROUTER[0]] = t
        elif expert is not None and stack_experts:
            experts.setdefault(m.group(1), {})[(expert.group(2), int(expert.group(1)))] = t
        elif expert is not None:
            out[f"{m.group(1)}block_sparse_moe.experts.{expert.group(1)}."
                f"{expert.group(2)}_proj.weight"] = t
        else:
            out[name] = t
    for layer, parts in experts.items():
        count = 1 + max(e for _, e in parts)
        out[layer + _EXPERTS_IN[0]] = torch.stack(
            [torch.cat((parts[("gate", e)], parts[("up", e)])) for e in range(count)])
        out[layer + _EXPERTS_OUT[0]] = torch.stack([parts[("down", e)] for e in range(count)])
    return out
