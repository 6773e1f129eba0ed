"""Bytes <-> protocol messages: one reused encoder, one reused typed decoder per direction.

msgspec refuses a single ``Decoder`` for a union that mixes ``array_like`` structs (the hot-path
``Jobs``/``JobsDone``, encoded as a msgpack array ``[tag, ...]``) with map-like ones (encoded as a
msgpack map ``{"type": tag, ...}``). So each union is split by that shape, and the first byte of
the frame, which says array or map, picks the typed decoder. The wire format is exactly what
``pivotflow.protocol`` defines; nothing here is ever unpickled or decoded untyped.
"""

from __future__ import annotations

import logging
import time
import typing
from typing import Any

import msgspec

from pivotflow.errors import ProtocolError
from pivotflow.protocol import MAX_FRAME_BYTES, ToController, ToWorker

__all__ = [
    "BadFrameLog",
    "decode_to_controller",
    "decode_to_worker",
    "encode",
    "encode_into",
    "sender_name",
]

# A reason quoted in an error or a log line is cut to this many characters.
_REASON_CHARS = 160

_encoder = msgspec.msgpack.Encoder()

# msgpack type bytes: fixarray 0x90-0x9f, array16 0xdc, array32 0xdd; fixmap 0x80-0x8f,
# map16 0xde, map32 0xdf.
_ARRAY_HEAD = frozenset(range(0x90, 0xA0)) | {0xDC, 0xDD}
_MAP_HEAD = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}


class _UnionDecoder:
    """Typed decoder of one protocol union, dispatching on the frame's msgpack shape."""

    __slots__ = ("_array", "_map", "_name")

    def __init__(self, union: Any, name: str) -> None:
        members = typing.get_args(union)
        arrays = tuple(t for t in members if t.__struct_config__.array_like)
        maps = tuple(t for t in members if not t.__struct_config__.array_like)
        self._name = name
        self._array = msgspec.msgpack.Decoder(typing.Union[arrays]) if arrays else None  # noqa: UP007
        self._map = msgspec.msgpack.Decoder(typing.Union[maps]) if maps else None  # noqa: UP007

    def decode(self, buf: bytes | bytearray | memoryview) -> Any:
        size = len(buf)
        if size == 0:
            raise ProtocolError(f"empty frame ({self._name})")
        if size > MAX_FRAME_BYTES:
            raise ProtocolError(f"frame of {size} bytes is over MAX_FRAME_BYTES ({self._name})")
        head = buf[0]
        if head in _ARRAY_HEAD:
            decoder = self._array
        elif head in _MAP_HEAD:
            decoder = self._map
        else:
            decoder = None
        if decoder is None:
            raise ProtocolError(
                f"frame starts with byte 0x{head:02x}, not a message ({self._name})"
            )
        try:
            return decoder.decode(buf)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError too
            raise ProtocolError(f"undecodable frame ({self._name}): {_short(exc)}") from None
        except RecursionError:
            raise ProtocolError(f"frame nested too deeply ({self._name})") from None
        except (ValueError, TypeError, OverflowError, MemoryError) as exc:
            # Untrusted input: whatever else msgspec may raise, a frame that fails is just bad.
            raise ProtocolError(
                f"frame failed to decode ({self._name}): {type(exc).__name__}: {_short(exc)}"
            ) from None


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


_to_controller = _UnionDecoder(ToController, "to controller")
_to_worker = _UnionDecoder(ToWorker, "to worker")


def encode(msg: ToController | ToWorker) -> bytes:
    """Serialize one protocol message to a msgpack frame."""
    return _encoder.encode(msg)


def encode_into(msg: ToController | ToWorker, buf: bytearray) -> None:
    """Serialize ``msg`` into ``buf`` (resized to fit), for callers that reuse one buffer."""
    _encoder.encode_into(msg, buf)


def decode_to_controller(buf: bytes | bytearray | memoryview) -> ToController:
    """Decode a frame a worker sent; raises ProtocolError if it is not exactly one message."""
    return typing.cast(ToController, _to_controller.decode(buf))


def decode_to_worker(buf: bytes | bytearray | memoryview) -> ToWorker:
    """Decode a frame the controller sent; raises ProtocolError if it is not exactly one message."""
    return typing.cast(ToWorker, _to_worker.decode(buf))


# Senders named in the "N more bad frames not logged" note; the rest are only counted.
_NOTE_SENDERS = 4


class BadFrameLog:
    """Warns about dropped frames, naming the sender, at most ``burst`` lines per ``window_s``.

    A peer spraying garbage must not turn the controller's log into its bottleneck; lines past
    the limit are counted, and the count (with the first few senders) is reported with the next
    line that gets through.
    """

    __slots__ = (
        "_burst",
        "_logger",
        "_logged",
        "_suppressed",
        "_suppressed_from",
        "_window_s",
        "_window_start",
    )

    def __init__(self, logger: logging.Logger, burst: int = 10, window_s: float = 10.0) -> None:
        self._logger = logger
        self._burst = burst
        self._window_s = window_s
        self._window_start = -float("inf")
        self._logged = 0
        self._suppressed = 0
        self._suppressed_from: dict[str, None] = {}  # insertion-ordered set

    def warn(self, transport: str, sender: bytes | str, reason: str) -> None:
        """Log one dropped frame from ``sender`` (a zmq identity or a worker id)."""
        now = time.monotonic()
        if now - self._window_start >= self._window_s:
            self._window_start = now
            self._logged = 0
        if self._logged >= self._burst:
            self._suppressed += 1
            if len(self._suppressed_from) < _NOTE_SENDERS:
                self._suppressed_from[sender_name(sender)] = None
            return
        self._logged += 1
        note = ""
        if self._suppressed:
            names = ", ".join(self._suppressed_from)
            more = ", ..." if len(self._suppressed_from) >= _NOTE_SENDERS else ""
            note = f" ({self._suppressed} more bad frames not logged, from {names}{more})"
            self._suppressed = 0
            self._suppressed_from.clear()
        self._logger.warning(
            "%s: dropped a bad frame from %s: %s%s", transport, sender_name(sender), reason, note
        )


def sender_name(sender: bytes | str) -> str:
    """A printable, bounded rendering of a peer identity for log lines and errors."""
    if isinstance(sender, bytes):
        sender = sender.decode("utf-8", "backslashreplace")
    return repr(sender[:64])
