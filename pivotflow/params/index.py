"""The index of one stored parameter version: where each tensor lies in the version's flat buffer.

A version is one flat byte buffer plus this index (msgspec msgpack, stored next to the buffer).
Every tensor starts at a multiple of ``ALIGN`` bytes so a view of it is aligned for any dtype and
for device copies. The index is checked whole on decode: a file that does not decode, or whose
entries fall outside the buffer, overlap, or disagree with their own dtype and shape, raises
CheckpointError naming the file.

The model's config is stored as plain data, exactly what its Hugging Face ``config.json`` holds,
so every engine (the embedded one, vLLM, SGLang) builds what it needs from the same record and
the store never depends on one engine's idea of a model. Format 1 stored the torch engine's
``ModelConfig`` instead; such an index is refused with a one-line error.
"""

from __future__ import annotations

import functools
import math
import zlib
from pathlib import Path
from typing import Any

import msgspec
import torch

from pivotflow.errors import CheckpointError

FORMAT = 2
ALIGN = 256  # bytes; CUDA's allocation alignment, so a view can feed a device copy unaided
_CRC_CHUNK = 64 << 20  # crc32 in slices: zlib takes a length that must fit in 32 bits


class TensorEntry(msgspec.Struct, array_like=True, frozen=True):
    """One tensor: its name, dtype (torch's name, e.g. "bfloat16"), shape and byte range."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class ParamIndex(msgspec.Struct, kw_only=True, frozen=True):
    """Everything but the bytes of ``model@version``; ``checksum`` is crc32 of the whole buffer
    (None when the store was told not to pay for one)."""

    format: int = FORMAT
    model: str
    version: int
    config: dict[str, Any]  # the model's Hugging Face config.json, as data
    nbytes: int
    entries: list[TensorEntry]
    checksum: int | None = None


class _Format(msgspec.Struct):
    """Just the format number: read first, so an index of another format is named as such
    instead of failing as 'corrupt' on whichever field changed."""

    format: int = 0


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ParamIndex)
_format_decoder = msgspec.msgpack.Decoder(_Format)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the name ``getattr(torch, name)`` gives back)."""
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str, where: str) -> torch.dtype:
    """The torch dtype named ``name``; raises CheckpointError naming ``where`` if none is."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"{where}: unknown dtype {name!r}")
    return dtype


@functools.lru_cache(maxsize=64)
def itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype``."""
    return torch.empty((), dtype=dtype).element_size()


def config_data(config: Any, where: str) -> dict[str, Any]:
    """``config`` as the JSON data ``config.json`` would hold (tuples become lists); raises
    CheckpointError naming ``where`` when it is not a dict of JSON values."""
    if not isinstance(config, dict):
        raise CheckpointError(
            f"{where}: the config must be the model's Hugging Face config as a dict "
            f"(config.json's contents), got {type(config).__name__}"
        )
    try:  # number keys become strings, as json.dump writes them
        data: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(config))
    except (TypeError, msgspec.EncodeError, msgspec.DecodeError) as exc:
        raise CheckpointError(f"{where}: the config is not JSON data: {exc}") from exc
    return data


def plan(
    model: str, version: int, tensors: dict[str, torch.Tensor], config: dict[str, Any]
) -> ParamIndex:
    """Lay ``tensors`` out in one buffer (insertion order, each aligned); raises CheckpointError
    naming a key that is not a string, a value that is not a tensor, or a config that is not
    JSON data."""
    data = config_data(config, f"publish {model}@v{version}")
    entries: list[TensorEntry] = []
    offset = 0
    for name, t in tensors.items():
        if not isinstance(name, str) or not isinstance(t, torch.Tensor):
            raise CheckpointError(
                f"publish {model}@v{version}: entry {name!r} is not a "
                f"str -> torch.Tensor pair (got {type(t).__name__})"
            )
        nbytes = t.numel() * t.element_size()
        entries.append(TensorEntry(name, dtype_name(t.dtype), tuple(t.shape), offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    # A zero-length file cannot be mapped, so even an empty set owns one aligned block.
    return ParamIndex(
        model=model, version=version, config=data, nbytes=max(offset, ALIGN), entries=entries
    )


def encode(index: ParamIndex) -> bytes:
    """The index as msgpack bytes."""
    return _encoder.encode(index)


def decode(data: bytes, path: Path) -> ParamIndex:
    """Decode and check an index read from ``path``; raises CheckpointError naming ``path``."""
    try:
        fmt = _format_decoder.decode(data).format
        if fmt != FORMAT:
            raise CheckpointError(
                f"parameter index {path} has format {fmt}; this pivotflow reads format "
                f"{FORMAT} (publish the model again)"
            )
        index = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CheckpointError(f"parameter index {path} is corrupt: {exc}") from exc
    end = 0
    for e in sorted(index.entries, key=lambda e: e.offset):
        dtype = dtype_of(e.dtype, f"parameter index {path}, tensor {e.name!r}")
        want = math.prod(e.shape) * itemsize(dtype)
        if e.nbytes != want or min(e.shape, default=0) < 0:
            raise CheckpointError(
                f"parameter index {path}: tensor {e.name!r} of shape "
                f"{list(e.shape)} {e.dtype} claims {e.nbytes} bytes, not {want}"
            )
        if e.offset < end or e.offset % ALIGN or e.offset + e.nbytes > index.nbytes:
            raise CheckpointError(
                f"parameter index {path}: tensor {e.name!r} at bytes "
                f"[{e.offset}, {e.offset + e.nbytes}) overlaps another or "
                f"falls outside the {index.nbytes}-byte buffer"
            )
        end = e.offset + e.nbytes
    if len({e.name for e in index.entries}) != len(index.entries):
        raise CheckpointError(f"parameter index {path} names a tensor twice")
    return index


def crc32(buffer: memoryview) -> int:
    """crc32 of ``buffer`` (zlib's, computed in slices so any size works)."""
    crc = 0
    for start in range(0, len(buffer), _CRC_CHUNK):
        crc = zlib.crc32(buffer[start : start + _CRC_CHUNK], crc)
    return crc
