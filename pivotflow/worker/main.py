"""A worker process: connects, takes a role, serves it until told to shut down.

Two threads, one owner each. The socket loop (this module) owns the zmq socket: it reads every
frame as it arrives, heartbeats on time and watches for its controller's exit, whatever compute
is doing. The compute thread (``compute.py``) owns the role: loads, train steps and engine steps
run there, for seconds or minutes on a real model, without the controller taking the silence
for a death. Messages cross in arrival order through a queue; answers come back through
another, and a ``WakePipe`` wakes the loop the moment one is ready.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import math
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import NoReturn

import torch
import zmq

# The real roles and what they load are imported here, before the handshake, not by the
# compute thread at its first AssignRole: an import loads C extensions with the GIL held, which
# would stall the heartbeats.
import pivotflow.engines.torch.engine  # noqa: F401
import pivotflow.engines.torch.weights  # noqa: F401
import pivotflow.tokenizer  # noqa: F401
from pivotflow.errors import ProtocolError, WorkerError
from pivotflow.params.shm_store import ShmParamStore
from pivotflow.protocol import (
    PROTOCOL_VERSION,
    Heartbeat,
    Hello,
    Reject,
    Shutdown,
    ToWorker,
    Welcome,
    WorkerFailed,
)
from pivotflow.transport.admission import TOKEN_ENV
from pivotflow.transport.codec import BadFrameLog
from pivotflow.transport.curve import CurveKeys, load_worker_keys
from pivotflow.transport.zmq_transport import ZmqWorkerChannel
from pivotflow.worker import generate_role, train_role  # noqa: F401  (imported early: above)
from pivotflow.worker.compute import ComputeFailed, ComputeThread, WakePipe
from pivotflow.worker.host import RoleHost

log = logging.getLogger("pivotflow.worker")

HANDSHAKE_TIMEOUT_S = 60.0
PARENT_CHECK_S = 1.0  # how often a worker waiting for its Welcome checks its controller lives
# After a Shutdown, how long the current step may run on before the process exits without it:
# an engine step ends well within it; a train step or role load of minutes is not waited for.
SHUTDOWN_GRACE_S = 2.0


class RoleFailed(WorkerError):
    """The role raised on the compute thread; the message is its type, text and traceback."""


class WakeableChannel(ZmqWorkerChannel):
    """The worker's DEALER, able to sleep until a frame arrives *or* a ``WakePipe`` rings."""

    def __init__(self, endpoint: str, worker_id: str, wake: WakePipe,
                 curve: CurveKeys | None = None) -> None:
        super().__init__(endpoint, worker_id, curve=curve)
        self._poller = zmq.Poller()
        self._poller.register(self._socket(), zmq.POLLIN)
        self._poller.register(wake.fileno(), zmq.POLLIN)

    def wait(self, timeout_s: float) -> None:
        """Return when a frame waits, the pipe rang, or after ``timeout_s``. zmq_poll asks the
        socket's EVENTS itself, so a frame already queued (its FD edge spent) returns at once."""
        self._poller.poll(max(0, math.ceil(timeout_s * 1000)))


class Worker:
    def __init__(self, endpoint: str, worker_id: str, curve: CurveKeys | None = None,
                 token: str = "") -> None:
        self.worker_id = worker_id
        self.token = token  # the run's proof that the controller launched this worker
        self.wake = WakePipe()
        self.chan = WakeableChannel(endpoint, worker_id, self.wake, curve=curve)
        self.compute: ComputeThread | None = None
        self.store: ShmParamStore | None = None
        self.heartbeat_s = 1.0
        self.running = True
        # the controller that launched this worker, or the zygote that forked it (which ends,
        # and takes its workers, when the controller's end of its pipe closes)
        self.parent_pid = os.getppid()
        self.bad_frames = 0
        self._bad_log = BadFrameLog(log)
        self.abandoned = False  # a Shutdown found compute in a step it did not wait for

    def handshake(self) -> None:
        self.chan.send(Hello(protocol_version=PROTOCOL_VERSION, worker_id=self.worker_id,
                             pid=os.getpid(), token=self.token))
        msg = None
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
        while msg is None and time.monotonic() < deadline:  # in slices: the controller may go
            msg = self.chan.recv(min(PARENT_CHECK_S, max(0.0, deadline - time.monotonic())))
            if msg is None and os.getppid() != self.parent_pid:
                raise WorkerError(f"worker {self.worker_id}: the controller exited during the "
                                  "handshake")
        match msg:
            case Welcome():
                if msg.protocol_version != PROTOCOL_VERSION:
                    raise WorkerError(f"controller speaks protocol {msg.protocol_version}, "
                                      f"this worker {PROTOCOL_VERSION}")
                self.store = ShmParamStore(msg.store_dir)
                self.heartbeat_s = msg.heartbeat_s
            case Reject(reason=reason):
                raise WorkerError(f"controller refused worker {self.worker_id}: {reason}")
            case None:
                raise WorkerError(f"no answer from the controller in {HANDSHAKE_TIMEOUT_S}s")
            case _:
                raise ProtocolError(f"expected Welcome, got {type(msg).__name__}")

    def serve(self) -> None:
        """Relay frames to compute and its answers back, heartbeating on time, until a
        Shutdown or the controller's exit. Raises RoleFailed if the role raised."""
        assert self.store is not None  # set by handshake, which always runs first
        compute = self.compute = ComputeThread(RoleHost(self.worker_id, self.store), self.wake)
        compute.start()
        next_beat = time.monotonic() + self.heartbeat_s
        while self.running:
            self.chan.wait(next_beat - time.monotonic())
            self.wake.clear()  # before taking: a ring after it announces a later answer
            for out in compute.take():
                if isinstance(out, ComputeFailed):
                    raise RoleFailed(out.error)
                self.chan.send(out)
            while self.running and (msg := self._recv()) is not None:
                if isinstance(msg, Shutdown):
                    self.running = False
                elif isinstance(msg, Welcome | Reject):
                    log.warning("worker %s ignores a late %s", self.worker_id, type(msg).__name__)
                else:
                    compute.submit(msg)
            now = time.monotonic()
            if now >= next_beat:
                if os.getppid() != self.parent_pid:
                    log.warning("worker %s: the controller is gone; exiting", self.worker_id)
                    self.running = False  # never outlive a controller killed without a goodbye
                self.chan.send(Heartbeat(worker_id=self.worker_id, busy=int(compute.busy)))
                next_beat = now + self.heartbeat_s

    def _recv(self) -> ToWorker | None:
        """The next waiting frame; a frame that does not decode is counted and dropped, as the
        controller does, rather than taken for the controller's intent."""
        while True:
            try:
                return self.chan.recv(0.0)
            except ProtocolError as exc:
                self.bad_frames += 1  # in the log line: the worker has no other report
                self._bad_log.warn(f"worker {self.worker_id}", "controller",
                                   f"{exc} ({self.bad_frames} dropped so far)")

    def close(self) -> None:
        """Stop compute (its role is released on its thread), then the socket."""
        if self.compute is not None and not self.compute.stop(SHUTDOWN_GRACE_S):
            self.abandoned = True
            log.warning("worker %s: exiting without waiting for its current step",
                        self.worker_id)
        self.chan.close()
        if not self.abandoned:  # a step still running would ring a closed fd
            self.wake.close()


def warm_torch() -> None:
    """Import now what torch imports lazily when the first model is built: ``nn.init`` on the
    meta device runs through ``torch._refs`` and imports torch._dynamo and sympy, ~800 modules
    and seconds, with the GIL held for up to 0.8 s at a time. On the compute thread that would
    stall the heartbeats of the first role load; here, before Hello, nobody is waiting."""
    with torch.device("meta"):
        probe = torch.nn.Sequential(torch.nn.Embedding(2, 2), torch.nn.Linear(2, 2))
    probe.to_empty(device="cpu")


def end_process(code: int) -> NoReturn:
    """End the worker as the interpreter's exit would, less its teardown: non-daemon threads
    joined, the atexit handlers run (logging's flush, multiprocessing's children, vLLM's), stdio
    flushed, then ``os._exit``. The teardown would only free what the process made; of the
    imports' objects, frozen (``gc.freeze`` in ``run_worker``), it frees nothing, and a library
    that counts its objects at exit (nanobind, under triton, in vLLM's environment) would print
    pages of "leaked" into the log whose tail the controller quotes when a worker dies."""
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_worker(endpoint: str, worker_id: str, curve_keys: str = "") -> int:
    """Process entry: returns the exit code (0 on a clean shutdown). A step still running
    after a Shutdown's grace is not waited for: the process ends at once (``os._exit``)."""
    torch.manual_seed(0)
    warm_torch()
    # what the imports made lives as long as the process: out of the collector's sight, the
    # exit's collections skip it (1.1 s of a worker's exit here, 0.2 s frozen) and a forked
    # worker leaves the zygote's pages shared instead of dirtying them with GC headers
    gc.freeze()
    curve = load_worker_keys(Path(curve_keys)) if curve_keys else None
    # popped: nothing this process starts (a compile, a tool) inherits it
    worker = Worker(endpoint, worker_id, curve, token=os.environ.pop(TOKEN_ENV, ""))
    code = 1
    try:
        worker.handshake()
        worker.serve()
        code = 0
    except RoleFailed as exc:  # formatted and logged on the compute thread
        with contextlib.suppress(Exception):
            worker.chan.send(WorkerFailed(error=str(exc)))
    except Exception as exc:
        tb = traceback.format_exc(limit=8)
        log.error("worker %s failed: %s", worker_id, tb)
        error = f"{type(exc).__name__}: {exc}\n{tb[-2000:]}"
        with contextlib.suppress(Exception):
            worker.chan.send(WorkerFailed(error=error))
    finally:
        worker.close()
    if worker.abandoned:
        sys.stdout.flush()
        sys.stderr.flush()
        # nothing is left to clean up, and finalizing the interpreter under a daemon thread
        # that is inside torch can crash or hang the exit
        os._exit(code)
    return code
