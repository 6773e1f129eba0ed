"""In-process transport for the simulator and unit tests.

By default every message is still encoded and decoded by ``pivotflow.transport.codec``, so the
local path checks the protocol exactly as the zmq path does, and arrives later through
``loop.call_soon``, so ordering and "nothing happens inside send" match the real transport.

``LocalHub(codec=False)`` is the simulator's mode: messages are handed over as the objects they
are (after a check that each is a member of its direction's union), with the same ordering and
the same deferred delivery. At 128+ simulated GPUs, msgpack round trips of real token lists were
a third of the simulator's time; the codec itself is tested on the default path and on zmq.
Without the codec nothing checks ``MAX_FRAME_BYTES`` either: a simulated trainer may receive a
batch larger than one real frame.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import typing
from collections.abc import Callable

from pivotflow.errors import ProtocolError, TransportError, WorkerError
from pivotflow.protocol import ToController, ToWorker
from pivotflow.transport.base import FlushHandler, MessageHandler
from pivotflow.transport.codec import BadFrameLog, decode_to_controller, decode_to_worker, encode

__all__ = ["LocalControllerTransport", "LocalHub", "LocalWorkerEnd"]

log = logging.getLogger(__name__)

_hub_ids = itertools.count()

# Message types each direction may carry when the codec is skipped.
_TO_WORKER = frozenset(typing.get_args(ToWorker))
_TO_CONTROLLER = frozenset(typing.get_args(ToController))


def _check_type(msg: object, allowed: frozenset[type], where: str) -> None:
    if type(msg) not in allowed:
        raise ProtocolError(f"{where}: {type(msg).__name__} is not a message of this direction")


class LocalHub:
    """One controller transport and the in-process workers connected to it."""

    def __init__(self, *, codec: bool = True) -> None:
        """``codec=False`` hands messages over without encoding them (see the module doc)."""
        self.controller = LocalControllerTransport(f"local://hub-{next(_hub_ids)}", codec=codec)
        self._workers = self.controller._workers

    def connect(self, worker_id: str) -> LocalWorkerEnd:
        """A new worker end addressed as ``worker_id``; a previous end with that id is replaced
        (like zmq's ROUTER_HANDOVER). Raises WorkerError for an empty id."""
        if not worker_id:
            raise WorkerError("a worker id must be a non-empty string")
        end = LocalWorkerEnd(self.controller, worker_id)
        self._workers[worker_id] = end
        return end


class LocalControllerTransport:
    """The controller's end of a ``LocalHub``; implements ``ControllerTransport``.

    Counters as on ``ZmqControllerTransport``: ``frames_in``, ``frames_out``, ``bad_frames``.
    """

    def __init__(self, endpoint: str, *, codec: bool = True) -> None:
        self.endpoint = endpoint
        self.codec = codec
        self.bad_frames = 0
        self.frames_in = 0
        self.frames_out = 0
        self._workers: dict[str, LocalWorkerEnd] = {}
        self._handler: MessageHandler | None = None
        self._flush: FlushHandler | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        # frames (or, without the codec, messages) sent before start, as zmq queues them
        self._early: list[tuple[str, bytes | ToController]] = []
        self._bad_log = BadFrameLog(log)

    def start(self, handler: MessageHandler, flush: FlushHandler | None = None) -> None:
        """Deliver each decoded message to ``handler(worker_id, msg)`` on the running loop,
        calling ``flush()`` after each (each delivery is its own run: one per loop callback).

        Raises TransportError if already started or closed.
        """
        if self._closed:
            raise TransportError(f"controller transport {self.endpoint} is closed")
        if self._handler is not None:
            raise TransportError(f"controller transport {self.endpoint} is already started")
        self._loop = asyncio.get_running_loop()
        self._handler = handler
        self._flush = flush
        early, self._early = self._early, []
        for worker_id, frame in early:
            self._loop.call_soon(self._receive, worker_id, frame)

    def send(self, worker_id: str, msg: ToWorker) -> None:
        """Queue ``msg`` for ``worker_id``'s inbox (delivered on the next loop iteration).

        Raises WorkerError if no such worker is connected, ProtocolError if ``msg`` does not
        survive a round trip through the codec, TransportError if closed or called off the loop.
        """
        if self._closed:
            raise TransportError(f"cannot send to worker {worker_id!r}: {self.endpoint} is closed")
        loop = self._loop or _running_loop(f"sending to worker {worker_id!r}")
        end = self._workers.get(worker_id)
        if end is None:
            raise WorkerError(f"worker {worker_id!r} is not connected to {self.endpoint}")
        # Decoded here rather than at the worker so a malformed message fails at its sender.
        if self.codec:
            decoded = decode_to_worker(encode(msg))
        else:
            _check_type(msg, _TO_WORKER, f"sending to worker {worker_id!r}")
            decoded = msg
        self.frames_out += 1
        loop.call_soon(end._deliver, decoded)

    def close(self) -> None:
        """Stop delivering in both directions. Idempotent."""
        self._closed = True
        self._handler = None
        self._flush = None
        self._early.clear()

    def _accept(self, worker_id: str, frame: bytes | ToController) -> None:
        if self._closed:
            raise TransportError(
                f"worker {worker_id!r}: controller transport {self.endpoint} is closed"
            )
        if self._loop is None:
            self._early.append((worker_id, frame))
        else:
            self._loop.call_soon(self._receive, worker_id, frame)

    def _receive(self, worker_id: str, frame: bytes | ToController) -> None:
        handler = self._handler
        if handler is None:
            return  # closed meanwhile
        if not isinstance(frame, (bytes, bytearray, memoryview)):  # handed over without codec
            msg = frame
        else:
            try:
                msg = decode_to_controller(frame)
            except ProtocolError as exc:
                self.bad_frames += 1
                self._bad_log.warn(f"controller transport {self.endpoint}", worker_id, str(exc))
                return
        self.frames_in += 1
        handler(worker_id, msg)
        if self._flush is not None:  # None too when the handler closed the transport
            self._flush()


class LocalWorkerEnd:
    """An in-process worker's end: ``send`` to the controller, ``inbox`` for its messages."""

    def __init__(self, controller: LocalControllerTransport, worker_id: str) -> None:
        self.worker_id = worker_id
        self.inbox: asyncio.Queue[ToWorker] = asyncio.Queue()
        # When set, each message is passed to this callback (on the loop, in order) instead of
        # the inbox: the simulator's workers react in callbacks, without a task per worker.
        self.on_message: Callable[[ToWorker], None] | None = None
        self._controller = controller
        self._connected = True

    def send(self, msg: ToController) -> None:
        """Send one message to the controller. Raises TransportError if either end is closed,
        and (without the codec) ProtocolError for an object that is not a ``ToController``."""
        if self._controller.codec:
            self.send_frame(encode(msg))
            return
        _check_type(msg, _TO_CONTROLLER, f"worker {self.worker_id!r}")
        if not self._connected:
            raise TransportError(f"worker {self.worker_id!r}: end is closed")
        self._controller._accept(self.worker_id, msg)

    def send_frame(self, frame: bytes) -> None:
        """Send raw bytes, as a peer on a real socket could (a bad frame is counted and dropped
        by the controller). Raises TransportError if either end is closed."""
        if not self._connected:
            raise TransportError(f"worker {self.worker_id!r}: end is closed")
        self._controller._accept(self.worker_id, frame)

    async def recv(self) -> ToWorker:
        """The next message from the controller (waits for one)."""
        return await self.inbox.get()

    def close(self) -> None:
        """Disconnect: the controller's sends to this id now raise WorkerError. Idempotent."""
        if self._connected:
            self._connected = False
            workers = self._controller._workers
            if workers.get(self.worker_id) is self:
                del workers[self.worker_id]

    def _deliver(self, msg: ToWorker) -> None:
        if self._connected:
            if self.on_message is not None:
                self.on_message(msg)
            else:
                self.inbox.put_nowait(msg)


def _running_loop(what: str) -> asyncio.AbstractEventLoop:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise TransportError(f"{what} needs a running event loop") from None
