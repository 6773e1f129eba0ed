"""The worker's compute thread: role loads, train steps and engine steps run here, so the
socket loop (``main.py``) keeps heartbeating and reading while they take seconds or minutes.

Nothing here touches the socket. The loop hands messages in through ``submit`` (a queue the
thread blocks on when it has nothing to do, and drains between engine steps, so an abort or a
new job waits at most one step); what the host answers goes out through ``take``, and every
answer rings a ``WakePipe`` the loop sleeps on beside its socket.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import traceback
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from pivotflow.protocol import ToController, ToWorker
from pivotflow.worker.host import RoleHost

log = logging.getLogger("pivotflow.worker")


class WakePipe:
    """A doorbell from the compute thread to the loop: a non-blocking pipe whose read end the
    loop polls beside its zmq socket.

    Why a pipe, and not a timeout or an inproc PAIR: the loop must wake within microseconds of
    a result (a job's round trip is ~25 us on an idle worker; bench/transport.py), and polling
    the socket on a short timeout would add up to a timeout to every result and wake the loop
    (taking the GIL from compute) hundreds of times a second. zmq.Poller polls a plain fd
    beside a socket; a PAIR would need a second zmq context (inproc works only within one, and
    the channel's is its own) and a socket owned by each thread. A full pipe is still
    readable, so a ring never blocks and rings coalesce.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def fileno(self) -> int:
        return self._read

    def ring(self) -> None:
        """Wake the loop (any thread; never blocks)."""
        with contextlib.suppress(BlockingIOError):  # full: the loop will wake anyway
            os.write(self._write, b"\0")

    def clear(self) -> None:
        """Forget past rings (the loop, before it takes what they announced)."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 4096):
                pass

    def close(self) -> None:
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass(frozen=True, slots=True)
class ComputeFailed:
    """The host raised: the worker reports ``error`` (type, message, traceback) and exits."""

    error: str


class _Stop:
    """Put in the inbox to wake a thread blocked on it so it sees it should stop."""


_STOP = _Stop()


class ComputeThread:
    """Drives a ``RoleHost`` on a thread of its own. ``submit``, ``take``, ``busy`` and
    ``stop`` are for the loop; everything else runs on the thread."""

    def __init__(self, host: RoleHost, wake: WakePipe) -> None:
        self.host = host
        self.wake = wake
        self._inbox: queue.SimpleQueue[ToWorker | _Stop] = queue.SimpleQueue()
        self._outbox: deque[ToController | ComputeFailed] = deque()  # append/popleft: atomic
        self._stopping = False
        self._busy = False
        # daemon: a Shutdown must not wait for a train step of minutes; the process exits
        # after a grace (``join``) and the step's result is not wanted any more
        self._thread = threading.Thread(target=self._run, name="pivotflow-compute", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, msg: ToWorker) -> None:
        """Queue a message for the host, in arrival order."""
        self._busy = True  # set here too, so a heartbeat right after a submit says busy
        self._inbox.put(msg)

    def take(self) -> list[ToController | ComputeFailed]:
        """Everything the host answered since the last call, in order."""
        out = []
        with contextlib.suppress(IndexError):
            while True:
                out.append(self._outbox.popleft())
        return out

    @property
    def busy(self) -> bool:
        """Handling a message, holding unhandled ones, or with jobs in its engine."""
        return self._busy

    def stop(self, grace_s: float) -> bool:
        """Stop after the current message or engine step; wait up to ``grace_s`` for it.
        True if the thread ended (the role is then released), False if it is still in a step
        (a train step, a role load) that the process will not wait for."""
        self._stopping = True
        self._inbox.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(grace_s)
        return not self._thread.is_alive()

    # ------------------------------------------------------------ on the thread

    def _post(self, msgs: Sequence[ToController | ComputeFailed]) -> None:
        if msgs:
            self._outbox.extend(msgs)
            self.wake.ring()

    def _handle(self, msg: ToWorker | _Stop) -> None:
        if not isinstance(msg, _Stop):
            self._post(self.host.handle(msg))

    def _run(self) -> None:
        try:
            while not self._stopping:
                if self.host.has_work():
                    # between engine steps: whatever arrived meanwhile (an abort, more jobs)
                    while not self._inbox.empty() and not self._stopping:
                        self._handle(self._inbox.get_nowait())
                    if not self._stopping and self.host.has_work():
                        self._post(self.host.step())
                    continue
                if self._inbox.empty():
                    self._busy = False
                msg = self._inbox.get()
                self._busy = True
                self._handle(msg)
        except Exception as exc:
            tb = traceback.format_exc(limit=8)
            log.error("worker %s failed: %s", self.host.worker_id, tb)
            self._post([ComputeFailed(f"{type(exc).__name__}: {exc}\n{tb[-2000:]}")])
        finally:
            self._busy = False
            try:
                self.host.release()
            except Exception:
                log.exception("worker %s: releasing its role failed", self.host.worker_id)
