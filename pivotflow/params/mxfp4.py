"""gpt-oss as the Hub ships it: its expert stacks in MXFP4 (``quantization_config``
``quant_method`` "mxfp4"), read as bfloat16 (``hf_layout.held_layout``), so the store, vLLM's
folders and checkpoints are unquantized."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pivotflow.errors import ModelConfigError

if TYPE_CHECKING:
    import torch


def is_mxfp4(config: dict[str, Any]) -> bool:
    """Whether ``config`` is gpt-oss's as the Hub ships it: experts in MXFP4."""
    quant = config.get("quantization_config")
    return isinstance(quant, dict) and quant.get("quant_method") == "mxfp4"


# the 16 values of a 4-bit float (E2M1), by its code
_FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def mxfp4_dequantized(tensors: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """gpt-oss's MXFP4 expert stacks as the bf16 ones its unquantized files hold: each
    ``X_blocks`` [E, out, G, 16] (two 4-bit codes a byte, low nibble first) with its
    ``X_scales`` [E, out, G] (a power of two per 32 values, biased by 127) becomes ``X``
    [E, in, out], in bfloat16, which holds every such value exactly (as transformers'
    ``Mxfp4Config(dequantize=True)`` computes it)."""
    import torch

    out = {k: v for k, v in tensors.items() if not k.endswith(("_blocks", "_scales"))}
    lut = torch.tensor(_FP4_VALUES, dtype=torch.bfloat16)
    for name, blocks in tensors.items():
        if not name.endswith("_blocks"):
            continue
        base = name.removesuffix("_blocks")
        scales = tensors.get(base + "_scales")
        if scales is None or blocks.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape:
            raise ModelConfigError(
                f"{where}: tensor {name!r} has no {base + '_scales'!r} of shape "
                f"{tuple(blocks.shape[:-1])} beside it (an MXFP4 stack needs both)")
        values = torch.empty(*blocks.shape[:-1], blocks.shape[-1] * 2, dtype=torch.bfloat16)
        values[..., 0::2] = lut[(blocks & 0x0F).long()]
        values[..., 1::2] = lut[(blocks >> 4).long()]
        values = torch.ldexp(values, (scales.to(torch.int32) - 127)[..., None])
        out[base] = values.flatten(-2).transpose(1, 2).contiguous()
    return out
