"""Write a safetensors file one tensor at a time.

Why: safetensors' ``save_file`` takes every tensor at once, in a dict. For the store's views
that costs nothing (they are its shared memory), but a sharded optimizer state exists whole
nowhere: joined for ``save_file`` it would be a second copy of the whole state in the
controller's process (for a 7B policy trained in bf16 under ``zero_stage=1``, float32 moments
and masters: 84 GB). This writes the header from each entry's dtype and shape, then each
tensor's bytes as it is read, so the writer holds one tensor at a time (``JoinedState`` joins
each entry only when it is read; ``bench/checkpoint_memory.py``). The file is the safetensors
format (an 8-byte little-endian header length, the JSON header padded with spaces to 8 bytes,
then the tensors' bytes back to back), which safetensors itself reads (tested).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
          torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
          torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
_BLOCK = 64 << 20  # bytes a write: one tensor's bytes go out in pieces, never copied whole


@runtime_checkable
class Specified(Protocol):
    """A mapping that tells an entry's dtype and shape without producing it."""

    def spec(self, name: str) -> tuple[torch.dtype, tuple[int, ...]]: ...


def save_streamed(tensors: Mapping[str, torch.Tensor], path: str | Path,
                  metadata: dict[str, str] | None = None) -> None:
    """``tensors`` (read one at a time, in their order) as a safetensors file at ``path``.
    Raises ValueError for a dtype safetensors has no name for, OSError when the write fails."""
    specs = {}
    offset = 0
    for name in tensors:
        dtype, shape = (tensors.spec(name) if isinstance(tensors, Specified)
                        else (tensors[name].dtype, tuple(tensors[name].shape)))
        if dtype not in DTYPES:
            raise ValueError(f"{name!r}: dtype {dtype} has no safetensors name")
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        specs[name] = {"dtype": DTYPES[dtype], "shape": list(shape),
                       "data_offsets": [offset, offset + size]}
        offset += size
    header = json.dumps({"__metadata__": metadata, **specs} if metadata else specs,
                        separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for name, spec in specs.items():
            t = tensors[name]
            if DTYPES.get(t.dtype) != spec["dtype"] or list(t.shape) != spec["shape"]:
                raise ValueError(f"{name!r} read as {t.dtype} {tuple(t.shape)}, not as its "
                                 f"spec {spec['dtype']} {tuple(spec['shape'])}")
            flat = t.detach().cpu().contiguous().reshape(-1)
            if flat.numel():
                data = flat.view(torch.uint8).numpy().data
                for i in range(0, len(data), _BLOCK):
                    f.write(data[i: i + _BLOCK])
                del data
            del t, flat  # (before the next is read: one tensor at a time, not two)

