"""A worker process: connects, takes a role, serves it until told to shut down.

The loop is synchronous on purpose: between engine steps it drains the socket without waiting,
and when idle it blocks on the socket until the next heartbeat is due.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import traceback
from pathlib import Path

import torch

from pivotflow.errors import ProtocolError, WorkerError
from pivotflow.params.shm_store import ShmParamStore
from pivotflow.protocol import (
    PROTOCOL_VERSION,
    AbortJobs,
    AssignRole,
    Heartbeat,
    Hello,
    Jobs,
    JobsDone,
    Reject,
    RoleReady,
    Shutdown,
    TrainStep,
    Welcome,
    WorkerFailed,
)
from pivotflow.transport.curve import CurveKeys, load_worker_keys
from pivotflow.transport.zmq_transport import ZmqWorkerChannel
from pivotflow.worker.generate_role import GenerateRole
from pivotflow.worker.train_role import TrainRole

log = logging.getLogger("pivotflow.worker")

HANDSHAKE_TIMEOUT_S = 60.0


class Worker:
    def __init__(self, endpoint: str, worker_id: str, curve: CurveKeys | None = None) -> None:
        self.worker_id = worker_id
        self.chan = ZmqWorkerChannel(endpoint, worker_id, curve=curve)
        self.role: GenerateRole | TrainRole | None = None
        self.store: ShmParamStore | None = None
        self.heartbeat_s = 1.0
        self.running = True
        self.parent_pid = os.getppid()  # the controller that launched this worker
        self.results_per_frame = 0  # 0: every result finished in a step shares one frame

    def handshake(self) -> None:
        self.chan.send(Hello(protocol_version=PROTOCOL_VERSION, worker_id=self.worker_id,
                             pid=os.getpid()))
        msg = self.chan.recv(HANDSHAKE_TIMEOUT_S)
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
        last_hb = time.monotonic()
        while self.running:
            busy = isinstance(self.role, GenerateRole) and self.role.has_work()
            msg = self.chan.recv(0.0 if busy else self.heartbeat_s / 2)
            while msg is not None and self.running:
                self.handle(msg)
                msg = self.chan.recv(0.0)
            if isinstance(self.role, GenerateRole) and self.role.has_work():
                done = self.role.step()
                n = self.results_per_frame or len(done) or 1
                for i in range(0, len(done), n):
                    self.chan.send(JobsDone(results=done[i : i + n]))
            now = time.monotonic()
            if now - last_hb >= self.heartbeat_s and os.getppid() != self.parent_pid:
                log.warning("worker %s: the controller is gone; exiting", self.worker_id)
                self.running = False  # never outlive a controller killed without a goodbye
            if now - last_hb >= self.heartbeat_s:
                busy_n = 1 if busy else 0
                self.chan.send(Heartbeat(worker_id=self.worker_id, busy=busy_n))
                last_hb = now

    def handle(self, msg: object) -> None:
        match msg:
            case Jobs(jobs=jobs):
                if not isinstance(self.role, GenerateRole):
                    raise WorkerError(f"worker {self.worker_id} got jobs without a generate role")
                rejected = self.role.add(jobs)
                if rejected:
                    self.chan.send(JobsDone(results=rejected))
            case TrainStep():
                if not isinstance(self.role, TrainRole):
                    raise WorkerError(f"worker {self.worker_id} got a train step without the "
                                      "train role")
                self.chan.send(self.role.train(msg))
            case AbortJobs(job_ids=ids):
                if isinstance(self.role, GenerateRole):
                    self.chan.send(JobsDone(results=self.role.abort(list(ids))))
            case AssignRole():
                self.assign(msg)
            case Shutdown():
                self.running = False
            case _:
                log.warning("worker %s ignores %s", self.worker_id, type(msg).__name__)

    def assign(self, msg: AssignRole) -> None:
        t0 = time.perf_counter()
        if self.role is not None:
            self.role.release()
            self.role = None
        release_s = time.perf_counter() - t0
        threads = int(msg.options.get("threads", 1))
        self.results_per_frame = int(msg.options.get("results_per_frame", 0))
        torch.set_num_threads(threads)
        assert self.store is not None  # set by handshake, which always runs first
        if msg.role == "generate":
            self.role = GenerateRole(self.store, msg.model, dict(msg.options))
        elif msg.role == "train":
            self.role = TrainRole(self.store, msg.model, dict(msg.options))
        else:
            raise WorkerError(f"unknown role {msg.role!r}")
        self.chan.send(RoleReady(role=msg.role, model=msg.model, version=self.role.version,
                                 load_s=self.role.load_s, release_s=release_s,
                                 warmup_s=self.role.warmup_s))

    def close(self) -> None:
        if self.role is not None:
            self.role.release()
        self.chan.close()


def run_worker(endpoint: str, worker_id: str, curve_keys: str = "") -> int:
    """Process entry: returns the exit code (0 on a clean shutdown)."""
    torch.manual_seed(0)
    curve = load_worker_keys(Path(curve_keys)) if curve_keys else None
    worker = Worker(endpoint, worker_id, curve)
    try:
        worker.handshake()
        worker.serve()
        return 0
    except Exception as exc:
        tb = traceback.format_exc(limit=8)
        log.error("worker %s failed: %s", worker_id, tb)
        with contextlib.suppress(Exception):
            worker.chan.send(WorkerFailed(error=f"{type(exc).__name__}: {exc}\n{tb[-2000:]}"))
        return 1
    finally:
        worker.close()
