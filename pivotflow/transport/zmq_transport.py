"""ZeroMQ transport: the controller's ROUTER on its event loop, and each worker's blocking DEALER.

The controller reads a plain (non-asyncio) ROUTER from the loop's reader callback. zmq's FD is
edge-triggered: it signals "something changed", not "a message is waiting", and any zmq call
(a send included) may consume that signal. So every wake-up drains until ``zmq.EVENTS`` shows
no input, and every send made outside a drain re-checks it and schedules a drain if input is
pending.
Awaiting ``zmq.asyncio`` once per message costs about twice the CPU per message (bench/transport.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import shutil
from collections.abc import Callable
from types import TracebackType
from typing import cast

import zmq

from pivotflow.errors import ConfigError, ProtocolError, TransportError, WorkerError
from pivotflow.protocol import MAX_FRAME_BYTES, Reject, ToController, ToWorker
from pivotflow.transport.admission import REFUSED, Admission, connection_identity
from pivotflow.transport.base import FlushHandler, MessageHandler
from pivotflow.transport.codec import BadFrameLog, decode_to_controller, decode_to_worker, encode
from pivotflow.transport.curve import (
    CurveAuthenticator,
    CurveKeys,
    configure_client,
    configure_server,
)
from pivotflow.transport.endpoints import check_bind_address, default_endpoint, ipc_dir_of

__all__ = ["ZmqControllerTransport", "ZmqWorkerChannel"]

log = logging.getLogger(__name__)

# Messages queued per peer and direction before a send fails (controller) or blocks (worker).
# The controller bounds in-flight work per worker far below this, so hitting it means a worker
# stopped reading; failing loudly beats buffering without limit.
DEFAULT_HWM = 100_000

# Messages handled per reader wake-up before yielding to other callbacks; the rest are drained
# from a call_soon continuation (the FD will not fire again for them).
DRAIN_BUDGET = 1024

# Frames up to this many times ``max_frame_bytes`` are read, counted and dropped with the sender
# named; libzmq (MAXMSGSIZE) cuts a peer that sends a larger one before buffering it, uncounted.
HARD_LIMIT_FACTOR = 2

# Distinct senders tracked in ``bad_frames_by_sender``; a peer can pick any identity, so the
# rest share one bucket rather than growing the dict without bound.
MAX_TRACKED_SENDERS = 1024
OTHER_SENDERS = "<other senders>"

_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_SNDMORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_RCVMORE, _EVENTS, _POLLIN = int(zmq.RCVMORE), int(zmq.EVENTS), int(zmq.POLLIN)


class ZmqControllerTransport:
    """The controller's ROUTER socket; implements ``ControllerTransport``.

    Binds at construction (``endpoint`` None = a private ipc path, removed on close; a tcp port
    of ``*`` picks a free one, and ``endpoint`` then holds the bound address). With ``curve``
    (from ``load_controller_keys``) it is a CurveZMQ server that admits only the allowed client
    keys, and may bind any tcp address. Raises ConfigError for a non-loopback address without
    keys or a bad ``max_frame_bytes``, CurveKeyError for unusable keys, and TransportError if
    the bind fails.
    Counters: ``frames_in`` (messages delivered), ``frames_out`` (messages sent), ``bad_frames``
    (frames dropped: not [identity, payload], over ``max_frame_bytes``, or undecodable),
    ``bad_frames_by_sender`` (the same by worker id), ``refused_peers`` (failed curve handshakes).
    Identities: ``admission`` (see admission.py) binds each worker id to the connection, and
    with curve to the key, of its first good Hello, and refuses and counts frames that claim it
    from elsewhere; with ``worker_secret`` a Hello must carry the worker's token.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        hwm: int = DEFAULT_HWM,
        curve: CurveKeys | None = None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        worker_secret: bytes | None = None,
    ) -> None:
        if not 0 < max_frame_bytes <= MAX_FRAME_BYTES:
            raise ConfigError(
                f"max_frame_bytes={max_frame_bytes} is not in 1..MAX_FRAME_BYTES ({MAX_FRAME_BYTES})"
            )
        owned_dir = None
        if endpoint is None:
            endpoint = default_endpoint()
            owned_dir = ipc_dir_of(endpoint)
        check_bind_address(endpoint, curve=curve is not None)
        self.bad_frames = 0
        self.bad_frames_by_sender: dict[str, int] = {}
        self.max_frame_bytes = max_frame_bytes
        self.frames_in = 0
        self.frames_out = 0
        self._hwm = hwm
        self._owned_dir = owned_dir
        self._handler: MessageHandler | None = None
        self._flush: FlushHandler | None = None
        self._unflushed = False  # messages delivered since the last flush
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_handle: asyncio.Handle | None = None
        self._draining = False
        self._bad_log = BadFrameLog(log)
        self.admission = Admission(worker_secret)
        self._curve = curve is not None
        self._reject = encode(Reject(reason=REFUSED))
        self._ctx = zmq.Context()
        self._auth: CurveAuthenticator | None = None
        self._sock: zmq.Socket[bytes] | None = self._ctx.socket(zmq.ROUTER)
        sock = self._sock
        if curve is not None:
            try:
                configure_server(sock, curve)
                # Before the bind: with no ZAP handler listening, libzmq admits any client.
                self._auth = CurveAuthenticator(self._ctx, curve)
            except BaseException:
                self.close()
                raise
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to an unknown peer raises, not drops
        # no handover: a second connection with a live identity must never take its messages
        # (a restarted worker comes back under a new id and identity anyway). The price: a
        # live worker's reconnect met before its old connection is retired is left unread by
        # libzmq, and the worker is replaced after worker_timeout_s (docs/architecture.md).
        sock.setsockopt(zmq.ROUTER_HANDOVER, 0)
        sock.setsockopt(zmq.RCVHWM, hwm)
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.setsockopt(zmq.MAXMSGSIZE, HARD_LIMIT_FACTOR * max_frame_bytes)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise TransportError(
                f"cannot bind the controller socket to {endpoint!r}: {exc}"
            ) from None
        self.endpoint: str = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._fd = cast(int, sock.getsockopt(zmq.FD))

    @property
    def refused_peers(self) -> int:
        """CurveZMQ handshakes refused because the client key is not allowed (0 without curve)."""
        return self._auth.refused if self._auth is not None else 0

    @property
    def authenticator(self) -> CurveAuthenticator | None:
        """The ZAP handler when curve is on (``reload()`` it after ``add_client``), else None."""
        return self._auth

    def start(self, handler: MessageHandler, flush: FlushHandler | None = None) -> None:
        """Deliver each decoded message to ``handler(worker_id, msg)`` on the running loop,
        and call ``flush()`` once no more input waits after a run of them.

        Raises TransportError if already started or closed.
        """
        if self._sock is None:
            raise TransportError(f"controller transport at {self.endpoint} is closed")
        if self._handler is not None:
            raise TransportError(f"controller transport at {self.endpoint} is already started")
        loop = asyncio.get_running_loop()
        self._handler = handler
        self._flush = flush
        self._loop = loop
        loop.add_reader(self._fd, self._drain)
        # Messages that arrived before start already spent the FD's edge.
        self._schedule_drain()

    def send(self, worker_id: str, msg: ToWorker) -> None:
        """Send ``msg`` to ``worker_id`` without blocking.

        Raises WorkerError if that worker is not connected or has stopped reading (its queue is
        full), TransportError if the transport is closed.
        """
        sock = self._sock
        if sock is None:
            raise TransportError(f"cannot send to worker {worker_id!r}: transport is closed")
        payload = encode(msg)
        try:
            # ROUTER_MANDATORY fails the identity part, so a message is never half sent.
            sock.send(self.admission.identity_of(worker_id), _NOBLOCK_SNDMORE)
            sock.send(payload, _NOBLOCK)
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                raise WorkerError(
                    f"worker {worker_id!r} is not connected to {self.endpoint}"
                ) from None
            if exc.errno == zmq.EAGAIN:
                raise WorkerError(
                    f"worker {worker_id!r} is not reading: {self._hwm} messages are queued"
                ) from None
            raise
        self.frames_out += 1
        # A send processes zmq's command queue and may swallow the FD edge of a message that
        # has just arrived; inside a drain the loop reads on until no input is left anyway.
        if not self._draining and cast(int, sock.getsockopt(_EVENTS)) & _POLLIN:
            self._schedule_drain()

    def close(self) -> None:
        """Stop delivering; close the socket (linger 0), then its context. Idempotent."""
        sock = self._sock
        if sock is None:
            return
        self._sock = None
        if self._drain_handle is not None:
            self._drain_handle.cancel()
            self._drain_handle = None
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._fd)
        sock.close(linger=0)  # sockets before the context, or term() can hang
        if self._auth is not None:
            self._auth.stop()  # its sockets too
        self._ctx.term()
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)

    def __enter__(self) -> ZmqControllerTransport:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _schedule_drain(self) -> None:
        if self._drain_handle is None and self._loop is not None:
            self._drain_handle = self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        """Read every waiting message (up to the budget), deliver good ones, drop bad ones."""
        self._drain_handle = None
        sock = self._sock
        handler = self._handler
        if sock is None or handler is None:
            return
        recv = sock.recv
        # plain ints and getsockopt: ``sock.rcvmore`` and enum flags cost a Python-level
        # attribute lookup and enum arithmetic per message
        more = functools.partial(sock.getsockopt, _RCVMORE)
        events = cast("Callable[[], int]", functools.partial(sock.getsockopt, _EVENTS))
        noblock = _NOBLOCK
        max_bytes = self.max_frame_bytes
        curve = self._curve
        registered = self.admission.fast
        finished = False
        self._draining = True
        try:
            for _ in range(DRAIN_BUDGET):
                # asking beats catching zmq.Again: raising it costs more than a message
                if not events() & _POLLIN:
                    if self._unflushed and self._flush is not None:
                        # its sends may let more input in (and swallow the FD edge): look again
                        self._unflushed = False
                        self._flush()
                        if self._sock is None:  # the flush closed the transport
                            finished = True
                            return
                        continue
                    finished = True
                    return
                identity = recv(noblock)
                # zmq delivers multipart messages whole: the other parts are already here.
                if not more():
                    self._bad_frame(identity, "frame has 1 part, expected [identity, payload]")
                    continue
                user_id = None
                if curve:  # the frame carries the key the ZAP handler admitted (its User-Id)
                    frame = recv(noblock, copy=False)
                    payload, user_id = frame.bytes, cast("str | None", frame.get("User-Id"))
                else:
                    payload = recv(noblock)
                if more():
                    parts = 2
                    while more():
                        recv(noblock)
                        parts += 1
                    self._bad_frame(identity, f"frame has {parts} parts, expected 2")
                    continue
                if len(payload) > max_bytes:
                    self._bad_frame(
                        identity, f"frame of {len(payload)} bytes is over the {max_bytes} limit"
                    )
                    continue
                try:
                    msg = decode_to_controller(payload)
                except ProtocolError as exc:
                    self._bad_frame(identity, str(exc))
                    continue
                worker_id = None if curve else registered(identity)
                if worker_id is None:
                    worker_id, reject = self.admission.admit(identity, user_id, msg)
                    if worker_id is None:
                        if reject:
                            self._refuse(identity)
                        continue
                self.frames_in += 1
                self._unflushed = True
                handler(worker_id, msg)
                if self._sock is None:  # the handler closed the transport
                    finished = True
                    return
        finally:
            self._draining = False
            # Out of budget, or the handler raised: messages may still wait, and no new FD
            # edge will announce them.
            if not finished and self._sock is not None:
                self._schedule_drain()

    def _refuse(self, identity: bytes) -> None:
        """Answer a refused Hello with a Reject that says nothing but "refused"."""
        if self._sock is None:
            return
        with contextlib.suppress(zmq.ZMQError):  # it may be gone, or anonymous to libzmq
            self._sock.send(identity, _NOBLOCK_SNDMORE)
            self._sock.send(self._reject, _NOBLOCK)

    def _bad_frame(self, identity: bytes, reason: str) -> None:
        self.bad_frames += 1
        by_sender = self.bad_frames_by_sender
        name = identity.decode("utf-8", "backslashreplace")  # the worker id the handler sees
        if name not in by_sender and len(by_sender) >= MAX_TRACKED_SENDERS:
            name = OTHER_SENDERS
        by_sender[name] = by_sender.get(name, 0) + 1
        self._bad_log.warn(f"controller transport at {self.endpoint}", identity, reason)


class ZmqWorkerChannel:
    """A worker's blocking DEALER to the controller; implements ``WorkerChannel``.

    The socket's zmq identity is ``worker_id`` and a random nonce (``connection_identity``);
    the controller addresses it by the worker id its Hello registered. Connecting is asynchronous: messages sent before the controller is up are queued.
    With ``curve`` (from ``load_worker_keys``) it is a CurveZMQ client; a controller that does
    not admit its key never receives a message: zmq ends that session for good without telling
    the sender, so a worker notices by its handshake (Hello) timing out.
    """

    def __init__(
        self,
        endpoint: str,
        worker_id: str,
        *,
        hwm: int = DEFAULT_HWM,
        curve: CurveKeys | None = None,
    ) -> None:
        if not worker_id:
            raise WorkerError("a worker id must be a non-empty string")
        self.endpoint = endpoint
        self.worker_id = worker_id
        self._ctx = zmq.Context()
        self._sock: zmq.Socket[bytes] | None = self._ctx.socket(zmq.DEALER)
        sock = self._sock
        sock.setsockopt(zmq.IDENTITY, connection_identity(worker_id))
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, hwm)
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        try:
            if curve is not None:
                configure_client(sock, curve)
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise TransportError(
                f"worker {worker_id!r} cannot connect to {endpoint!r}: {exc}"
            ) from None

    def send(self, msg: ToController) -> None:
        """Send one message (blocks only while the queue to the controller is full).

        Raises TransportError if the channel is closed.
        """
        self._socket().send(encode(msg))

    def recv(self, timeout_s: float) -> ToWorker | None:
        """The next message, or None after ``timeout_s`` seconds (0 = do not wait).

        Raises ProtocolError if the controller sent a frame that does not decode (the frame is
        consumed), TransportError if the channel is closed.
        """
        sock = self._socket()
        # Asking beats catching zmq.Again: a busy worker asks once per engine step, and raising
        # costs more than the question (as in the controller's drain).
        if not cast(int, sock.getsockopt(_EVENTS)) & _POLLIN and (
            timeout_s <= 0 or not sock.poll(math.ceil(timeout_s * 1000), zmq.POLLIN)
        ):
            return None
        frame = sock.recv(_NOBLOCK)
        if sock.getsockopt(_RCVMORE):
            parts = 1
            while sock.getsockopt(_RCVMORE):
                sock.recv(zmq.NOBLOCK)
                parts += 1
            raise ProtocolError(
                f"worker {self.worker_id!r} got a frame of {parts} parts, expected 1"
            )
        return decode_to_worker(frame)

    def close(self) -> None:
        """Close the socket (linger 0), then its context. Idempotent."""
        sock = self._sock
        if sock is None:
            return
        self._sock = None
        sock.close(linger=0)
        self._ctx.term()

    def __enter__(self) -> ZmqWorkerChannel:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _socket(self) -> zmq.Socket[bytes]:
        if self._sock is None:
            raise TransportError(f"worker {self.worker_id!r}: channel is closed")
        return self._sock
