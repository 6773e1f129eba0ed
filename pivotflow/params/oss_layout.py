"""gpt-oss's tensors on disk and as pivotflow holds them (``hf_layout`` dispatches here): its
file names the router ``mlp.router`` and stores a layer's experts fused, ``gate_up_proj``
[E, H, 2I] (input-major, gate and up interleaved by column) with ``gate_up_proj_bias`` [E, 2I],
``down_proj`` [E, I, H] with ``down_proj_bias`` [E, H]; pivotflow holds the router as
``mlp.gate`` and each expert's projections as its own linears (``mlp.experts.E.gate_proj``).
``oss_split`` reads the file's into pivotflow's, ``oss_fused`` writes them back, and
``oss_engine`` gives vLLM one expert at a time, under the file's names."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pivotflow.errors import ModelConfigError

if TYPE_CHECKING:
    import torch

_OSS_FUSED = re.compile(r"(.*\.mlp\.)experts\.(gate_up_proj|down_proj)(_bias)?")
_OSS_ROUTER = re.compile(r"(.*\.mlp\.)router\.(weight|bias)")
_OSS_EXPERT = re.compile(r"(.*\.mlp\.)experts\.(\d+)\.(gate|up|down)_proj\.(weight|bias)")
_OSS_GATE = re.compile(r"(.*\.mlp\.)gate\.(weight|bias)")


def oss_split(tensors: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """gpt-oss's file as pivotflow holds it: the router as ``mlp.gate``, each expert's gate, up
    and down projections (weights [out, in] and biases) as its own linears."""
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if (m := _OSS_ROUTER.fullmatch(name)) is not None:
            out[f"{m.group(1)}gate.{m.group(2)}"] = t
            continue
        m = _OSS_FUSED.fullmatch(name)
        if m is None:
            out[name] = t
            continue
        prefix, proj, bias = m.group(1), m.group(2), bool(m.group(3))
        if t.dim() != (2 if bias else 3):
            raise ModelConfigError(f"{where}: tensor {name!r} has shape {tuple(t.shape)}, not "
                                   f"one {'bias' if bias else 'matrix'} per expert")
        kind = "bias" if bias else "weight"
        for e in range(t.shape[0]):
            part = t[e] if bias else t[e].t()  # ([in, out] in the file: [out, in] held)
            if proj == "down_proj":
                out[f"{prefix}experts.{e}.down_proj.{kind}"] = part.contiguous()
            else:  # gate and up interleaved: gate's units at even places, up's at odd
                out[f"{prefix}experts.{e}.gate_proj.{kind}"] = part[0::2].contiguous()
                out[f"{prefix}experts.{e}.up_proj.{kind}"] = part[1::2].contiguous()
    return out


def _experts(tensors: dict[str, torch.Tensor]) -> tuple[
        dict[str, torch.Tensor], dict[tuple[str, int], dict[str, torch.Tensor]]]:
    """pivotflow's gpt-oss tensors sorted for writing: every tensor but the experts' (the
    router renamed ``mlp.router``, as the file names it), and each (layer prefix, expert)'s
    projections by ``"gate.weight"``, ``"up.bias"``..."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        if (m := _OSS_GATE.fullmatch(name)) is not None:
            out[f"{m.group(1)}router.{m.group(2)}"] = t
        elif (m := _OSS_EXPERT.fullmatch(name)) is not None:
            experts.setdefault((m.group(1), int(m.group(2))), {})[
                f"{m.group(3)}.{m.group(4)}"] = t
        else:
            out[name] = t
    return out, experts


def _interleaved(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gpt-oss's gate and up rows (or biases) interleaved by unit: gate 0, up 0, gate 1..."""
    import torch

    return torch.stack((gate, up), 1).flatten(0, 1)


def oss_fused(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``oss_split`` undone: the router as ``mlp.router``, each layer's experts stacked into
    the file's fused tensors (gate and up interleaved again)."""
    import torch

    out, experts = _experts(tensors)
    for prefix in dict.fromkeys(prefix for prefix, _ in experts):
        parts = [experts[key] for key in sorted(k for k in experts if k[0] == prefix)]
        for kind, suffix in (("weight", ""), ("bias", "_bias")):
            gate_up = torch.stack([_interleaved(p[f"gate.{kind}"], p[f"up.{kind}"])
                                   for p in parts])
            down = torch.stack([p[f"down.{kind}"] for p in parts])
            if kind == "weight":  # ([out, in] held: [in, out] in the file)
                gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
            out[f"{prefix}experts.gate_up_proj{suffix}"] = gate_up.contiguous()
            out[f"{prefix}experts.down_proj{suffix}"] = down.contiguous()
    return out


def oss_engine(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """gpt-oss's experts one at a time, under the per-expert names vLLM's loader takes
    (``mlp.experts.E.w13_weight`` [H, 2I] gate and up interleaved, ``w13_bias``, ``w2_weight``
    [I, H], ``w2_bias``: each expert's slice of the file's stacks), the router as the file
    names it. vLLM 0.32 copies the file's whole stacks into its parameters directly, which its
    in-place reload never sees (a reload left the experts as they were, found on gpt-oss); it
    loads these through the experts' own loader, which the reload follows."""
    out, experts = _experts(tensors)
    for (prefix, e), p in experts.items():
        head = f"{prefix}experts.{e}."
        out[head + "w13_weight"] = _interleaved(p["gate.weight"], p["up.weight"]).t()
        out[head + "w13_bias"] = _interleaved(p["gate.bias"], p["up.bias"])
        out[head + "w2_weight"] = p["down.weight"].t()
        out[head + "w2_bias"] = p["down.bias"]
    return out
