"""Qwen3-VL-MoE's experts as pivotflow holds them: each expert's gate, up and down
projections its own linears (``mlp.experts.E.gate_proj.weight`` [I, H]...), as Qwen3-MoE's
(and GLM-4.6V's, whose wrapper transformers 5 saves with its GLM-4.5V experts stacked too).

Its files stack a layer's experts fused, under names with no ``.weight``:
``mlp.experts.gate_up_proj`` (gate's rows, then up's) and ``mlp.experts.down_proj``. The Hub's
lie input-major, [E, H, 2I] and [E, I, H] (vLLM reads them so); transformers 5 holds and
saves them output-major, [E, 2I, H] and [E, H, I], and reads either by their shape. So does
pivotflow, which writes a Qwen3MoeForCausalLM's folder (one tensor per expert) back.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pivotflow.errors import ModelConfigError

if TYPE_CHECKING:
    import torch

    from pivotflow.engines.torch.model_config import ModelConfig

# (under the file's names: ``model.language_model.layers.N...``, as the Hub's)
_STACKED = re.compile(r"(.*layers\.\d+\.mlp\.experts\.)(gate_up_proj|down_proj)")


def qwen_vl_experts(cfg: ModelConfig, tensors: dict[str, torch.Tensor],
                    where: str) -> dict[str, torch.Tensor]:
    """``tensors`` with every stacked experts tensor split into its experts' projections
    (views where the file lies output-major); the rest as they are. Raises ModelConfigError
    naming ``where`` and the tensor for a stack of another shape, or a square one (which way it
    lies cannot be told from its shape)."""
    out: dict[str, torch.Tensor] = {}
    width, hidden = cfg.moe_intermediate_size, cfg.hidden_size
    for name, t in tensors.items():
        if (m := _STACKED.fullmatch(name)) is None:
            out[name] = t
            continue
        prefix, fused = m.group(1), m.group(2) == "gate_up_proj"
        rows, cols = (2 * width, hidden) if fused else (hidden, width)  # ([out, in] per expert)
        shape = tuple(t.shape)
        if len(shape) != 3 or shape[0] != cfg.num_experts or rows == cols or (
                shape[1:] not in ((rows, cols), (cols, rows))):
            raise ModelConfigError(
                f"{where}: tensor {name!r} has shape {list(shape)}, not [{cfg.num_experts}, "
                f"{cols}, {rows}] (input-major) or [{cfg.num_experts}, {rows}, {cols}]"
                + (" (square: which way it lies cannot be told)" if rows == cols else ""))
        stack = t if shape[1:] == (rows, cols) else t.transpose(1, 2)
        for e in range(shape[0]):
            if fused:
                out[f"{prefix}{e}.gate_proj.weight"] = stack[e, :width].contiguous()
                out[f"{prefix}{e}.up_proj.weight"] = stack[e, width:].contiguous()
            else:
                out[f"{prefix}{e}.down_proj.weight"] = stack[e].contiguous()
    return out
