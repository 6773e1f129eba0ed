"""Experts stacked in a file, as pivotflow holds them: each expert's gate, up and down
projections its own linears (``mlp.experts.E.gate_proj.weight`` [I, H]...), as Qwen3-MoE's.

Some files stack a layer's experts fused, under names with no ``.weight``:
``mlp.experts.gate_up_proj`` (gate's rows, then up's) and ``mlp.experts.down_proj``.
Qwen3-VL-MoE's (and GLM-4.6V's, whose wrapper transformers 5 saves with its GLM-4.5V experts
stacked too): the Hub's lie input-major, [E, H, 2I] and [E, I, H] (vLLM reads them so);
transformers 5 holds and saves them output-major, [E, 2I, H] and [E, H, I], and reads either
by their shape. So does pivotflow (``split_stacks``), which writes a Qwen3MoeForCausalLM's
folder (one tensor per expert) back. Mistral 4's files (which transformers reads with no
conversion) hold its module's own stacks, output-major only: read so whatever their shape
(square ones too), and written so (``stacked``); Llama 4's, as its module holds them,
input-major only (``input_major``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pivotflow.errors import ModelConfigError

if TYPE_CHECKING:
    import torch

    from pivotflow.engines.torch.model_config import ModelConfig

# (under the file's names: ``model.language_model.layers.N...``, as the Hub's; Gemma 4's
# experts beside its MLP as pivotflow holds them, ``moe.experts``: gemma4_layout)
_STACKED = re.compile(r"(.*layers\.\d+\.(?:mlp|moe)\.experts\.)(gate_up_proj|down_proj)")
_EXPERT = re.compile(
    r"(.*layers\.\d+\.(?:mlp|moe)\.experts\.)(\d+)\.(gate|up|down)_proj\.weight")


def split_stacks(cfg: ModelConfig, tensors: dict[str, torch.Tensor], where: str,
                 either_way: bool = True, input_major: bool = False) -> dict[str, torch.Tensor]:
    """``tensors`` with every stacked experts tensor split into its experts' projections
    (views where the file lies output-major); the rest as they are. ``either_way``: a stack
    may lie input-major too, told by its shape; ``input_major``: it lies so (Llama 4's),
    whatever its shape. Raises ModelConfigError naming ``where`` and the tensor for a stack of
    another shape, or, ``either_way``, a square one (which way it lies cannot be told from its
    shape)."""
    out: dict[str, torch.Tensor] = {}
    width, hidden = cfg.moe_intermediate_size, cfg.hidden_size
    for name, t in tensors.items():
        if (m := _STACKED.fullmatch(name)) is None:
            out[name] = t
            continue
        prefix, fused = m.group(1), m.group(2) == "gate_up_proj"
        rows, cols = (2 * width, hidden) if fused else (hidden, width)  # ([out, in] per expert)
        shape = tuple(t.shape)
        # (which ways it may lie: output-major [E, rows, cols], input-major [E, cols, rows])
        output, inputs = not input_major, input_major or either_way
        square = output and inputs and rows == cols
        ways = [w for w, ok in (((cols, rows), inputs), ((rows, cols), output)) if ok]
        if len(shape) != 3 or shape[0] != cfg.num_experts or square or shape[1:] not in ways:
            raise ModelConfigError(
                f"{where}: tensor {name!r} has shape {list(shape)}, not "
                + (f"[{cfg.num_experts}, {cols}, {rows}] (input-major)" if inputs else "")
                + (" or " if inputs and output else "")
                + (f"[{cfg.num_experts}, {rows}, {cols}]" if output else "")
                + (" (square: which way it lies cannot be told)" if square else ""))
        lies_output = output and shape[1:] == (rows, cols)
        stack = t if lies_output else t.transpose(1, 2)
        for e in range(shape[0]):
            if fused:
                out[f"{prefix}{e}.gate_proj.weight"] = stack[e, :width].contiguous()
                out[f"{prefix}{e}.up_proj.weight"] = stack[e, width:].contiguous()
            else:
                out[f"{prefix}{e}.down_proj.weight"] = stack[e].contiguous()
    return out


def stacked(tensors: dict[str, torch.Tensor],
            input_major: bool = False) -> dict[str, torch.Tensor]:
    """``split_stacks`` undone, output-major: each layer's experts as ``gate_up_proj``
    [E, 2I, H] and ``down_proj`` [E, H, I] (``input_major``: [E, H, 2I] and [E, I, H]); the
    rest as they are."""
    import torch

    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name, t in tensors.items():
        if (m := _EXPERT.fullmatch(name)) is None:
            out[name] = t
            continue
        experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = t
    for prefix, parts in experts.items():
        ordered = [parts[e] for e in sorted(parts)]
        gate_up = torch.stack([torch.cat((p["gate"], p["up"])) for p in ordered])
        down = torch.stack([p["down"] for p in ordered])
        if input_major:
            gate_up, down = gate_up.transpose(1, 2).contiguous(), down.transpose(1, 2).contiguous()
        out[f"{prefix}gate_up_proj"], out[f"{prefix}down_proj"] = gate_up, down
    return out
