"""Frames on the pipes between the local launcher and its worker zygote: a 4-byte big-endian
length, then one msgpack-encoded message of ``pivotflow.protocol`` (``ForkWorker`` one way,
``FromZygote`` the other), decoded typed. A frame that does not decode is a ProtocolError."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import msgspec

from pivotflow.errors import ProtocolError
from pivotflow.protocol import MAX_FRAME_BYTES

T = TypeVar("T")
_HEAD = struct.Struct(">I")
_encoder = msgspec.msgpack.Encoder()


def write_frame(fd: int, msg: Any) -> None:
    """Write one message whole (a pipe write may be partial past PIPE_BUF)."""
    body = _encoder.encode(msg)
    view = memoryview(_HEAD.pack(len(body)) + body)
    while view:
        view = view[os.write(fd, view):]


class FrameReader(Generic[T]):
    """Bytes as they arrive -> whole messages of ``kind``."""

    def __init__(self, kind: Any, source: str) -> None:
        self._decoder: msgspec.msgpack.Decoder[T] = msgspec.msgpack.Decoder(kind)
        self._buf = bytearray()
        self._source = source

    def feed(self, data: bytes) -> Iterator[T]:
        self._buf += data
        while len(self._buf) >= _HEAD.size:
            (n,) = _HEAD.unpack_from(self._buf)
            if n > MAX_FRAME_BYTES:
                raise ProtocolError(f"{self._source}: a frame of {n} bytes (at most "
                                    f"{MAX_FRAME_BYTES})")
            if len(self._buf) < _HEAD.size + n:
                return
            body = bytes(self._buf[_HEAD.size: _HEAD.size + n])
            del self._buf[: _HEAD.size + n]
            try:
                yield self._decoder.decode(body)
            except msgspec.DecodeError as exc:  # (a ValidationError is one)
                raise ProtocolError(f"{self._source}: a frame that does not decode: "
                                    f"{str(exc)[:160]}") from None
