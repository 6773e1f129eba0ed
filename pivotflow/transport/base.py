"""The transport interface the controller is written against (zmq for real, local for sim/tests)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from pivotflow.protocol import ToController, ToWorker

# Called on the controller's event loop for every decoded message: (worker_id, message).
MessageHandler = Callable[[str, ToController], None]
# Called after a run of delivered messages (all that were waiting): the receiver acts once per
# run (dispatching what became ready) instead of once per message.
FlushHandler = Callable[[], None]


class ControllerTransport(Protocol):
    """The controller's end: one socket, many workers, addressed by worker id."""

    endpoint: str
    bad_frames: int

    def start(self, handler: MessageHandler, flush: FlushHandler | None = None) -> None:
        """Begin delivering messages to ``handler`` on the running event loop, calling
        ``flush`` after each run of them."""
        ...

    def send(self, worker_id: str, msg: ToWorker) -> None:
        """Send one message; raises WorkerError if the worker is not connected."""
        ...

    def close(self) -> None:
        """Stop delivering, close the socket (linger 0)."""
        ...


class WorkerChannel(Protocol):
    """A worker's end: blocking, polled between engine steps."""

    def send(self, msg: ToController) -> None: ...

    def recv(self, timeout_s: float) -> ToWorker | None:
        """Next message, or None after ``timeout_s`` (0 = do not wait)."""
        ...

    def close(self) -> None: ...
