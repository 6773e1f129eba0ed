"""Block-wise FP8 checkpoints (``quantization_config`` ``quant_method`` "fp8" with a
``weight_block_size``), as DeepSeek-V3/R1, Kimi K2 and the Qwen3 ``-FP8`` models ship them,
read as bfloat16.

Each quantized linear's ``X.weight`` is float8 (E4M3) [out, in] with ``X.weight_scale_inv``
(float32) [ceil(out / bm), ceil(in / bn)] beside it: value = code * scale of its block, blocks
bm x bn (``weight_block_size``, 128 x 128 in every such checkpoint), the last ones cut short
where a width is no multiple of the block (DeepSeek-V3's kv_a_proj_with_mqa: 576 rows in 5
blocks). Embeddings, norms, routers and the head are not quantized. pivotflow trains and
serves bfloat16, so the folder is dequantized as it is read (``hf_layout.held_layout``) and
``held_config`` drops the quantization: the store, vLLM's folders and checkpoints are bf16.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pivotflow.errors import ModelConfigError

if TYPE_CHECKING:
    import torch

SCALE = ".weight_scale_inv"


def is_fp8_blocks(config: dict[str, Any]) -> bool:
    """Whether ``config`` says block-wise FP8 weights (``quant_method`` fp8 with a
    ``weight_block_size``); per-tensor FP8 and other schemes are not this."""
    quant = config.get("quantization_config")
    return (isinstance(quant, dict) and quant.get("quant_method") == "fp8"
            and quant.get("weight_block_size") is not None)


def block_size(config: dict[str, Any], where: str) -> tuple[int, int]:
    """The config's ``weight_block_size`` [rows, columns]; a one-line error naming ``where``
    if it is not two positive integers."""
    size = config["quantization_config"]["weight_block_size"]
    if (not isinstance(size, list) or len(size) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in size)):
        raise ModelConfigError(f"{where}: quantization_config.weight_block_size={size!r} is not "
                               "two positive integers")
    return size[0], size[1]


def fp8_dequantized(tensors: dict[str, torch.Tensor], block: tuple[int, int],
                    where: str) -> dict[str, torch.Tensor]:
    """``tensors`` with every FP8 weight and its ``weight_scale_inv`` replaced by the bf16
    weight they encode (in float32, then rounded once); the others as they are. Raises
    ModelConfigError naming ``where`` and the tensor for an FP8 weight without its scales, or
    scales that do not tile it."""
    import torch

    fp8 = {torch.float8_e4m3fn, torch.float8_e5m2}
    out = {k: v for k, v in tensors.items() if not k.endswith(SCALE)}
    for name, t in tensors.items():
        if t.dtype not in fp8:
            continue
        scale_name = name.removesuffix(".weight") + SCALE
        scales = tensors.get(scale_name)
        rows, cols = t.shape[-2:] if t.dim() >= 2 else (0, 0)
        grid = (-(-rows // block[0]), -(-cols // block[1]))
        if scales is None or t.dim() != 2 or tuple(scales.shape) != grid:
            raise ModelConfigError(
                f"{where}: FP8 tensor {name!r} has no {scale_name!r} of shape {grid} beside "
                f"it (block-wise FP8 needs one scale per {block[0]}x{block[1]} block)")
        per_value = (scales.float().repeat_interleave(block[0], 0)[:rows]
                     .repeat_interleave(block[1], 1)[:, :cols])
        out[name] = (t.float() * per_value).to(torch.bfloat16)
    return out
