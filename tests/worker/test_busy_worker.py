"""A worker busy for many heartbeat intervals is still heard: real worker processes
(``python -m pivotflow.worker``) on the real zmq transport, with real compute that takes
seconds, and the test playing the controller through the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import zmq

from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.engines.torch.weights import config_to_hf
from pivotflow.errors import WorkerError
from pivotflow.launch.local import LocalLauncher
from pivotflow.params.shm_store import ShmParamStore
from pivotflow.protocol import (
    PROTOCOL_VERSION,
    AbortJobs,
    AssignRole,
    GenerateJob,
    Heartbeat,
    Hello,
    Jobs,
    JobsDone,
    RoleReady,
    Shutdown,
    ToWorker,
    TrainDone,
    TrainSeq,
    TrainStep,
    Welcome,
    WorkerFailed,
)
from pivotflow.transport.zmq_transport import ZmqControllerTransport

pytestmark = pytest.mark.timeout(600)

HEARTBEAT_S = 0.1
# What the test stands in for the controller's worker_timeout_s: a worker silent this long
# would be declared dead. Every step below takes several times it.
TIMEOUT_S = 1.0
VOCAB = 512
# ~4.3M parameters: one train step on the batch below is ~4e11 flops, seconds on one core
BIG = ModelConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=1024,
                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=1536)


@dataclass
class Heard:
    """One message from the worker and when it arrived (monotonic seconds)."""

    at: float
    msg: Any


@dataclass
class Peer:
    """The controller's end: the real ROUTER transport, every message kept in order."""

    transport: ZmqControllerTransport
    heard: list[Heard] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def on_message(self, worker_id: str, msg: Any) -> None:
        self.heard.append(Heard(time.monotonic(), msg))
        self.arrived.set()

    def send(self, msg: ToWorker) -> float:
        self.transport.send("w0", msg)
        return time.monotonic()

    async def next(self, kind: type, after: float = 0.0, timeout_s: float = 120.0) -> Heard:
        """The first message of ``kind`` that arrived after ``after``."""
        deadline = time.monotonic() + timeout_s
        while True:
            for h in self.heard:
                if h.at >= after and isinstance(h.msg, kind):
                    return h
            failed = [h.msg for h in self.heard if isinstance(h.msg, WorkerFailed)]
            assert not failed or kind is WorkerFailed, failed[0].error
            left = deadline - time.monotonic()
            assert left > 0, f"no {kind.__name__} in {timeout_s}s"
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), left)

    def beats(self, start: float, end: float) -> list[float]:
        return [h.at for h in self.heard if isinstance(h.msg, Heartbeat) and start <= h.at <= end]


@dataclass
class Running:
    peer: Peer
    launcher: LocalLauncher


def publish(store: ShmParamStore, name: str, cfg: ModelConfig) -> None:
    torch.manual_seed(0)
    store.publish(name, 0, Decoder(cfg).state_dict(), config_to_hf(cfg, torch.float32))


@pytest.fixture
async def worker(tmp_path: Path) -> AsyncIterator[Running]:
    """One worker process, welcomed with a heartbeat of HEARTBEAT_S, holding no role yet."""
    store = ShmParamStore(tmp_path / "store")
    publish(store, "policy", BIG)
    transport = ZmqControllerTransport()
    peer = Peer(transport)
    transport.start(peer.on_message)
    launcher = LocalLauncher(transport.endpoint, tmp_path / "logs")
    launcher.start("w0")
    try:
        hello = await peer.next(Hello, timeout_s=120)
        assert hello.msg.protocol_version == PROTOCOL_VERSION
        peer.send(Welcome(protocol_version=PROTOCOL_VERSION, store_dir=str(store.root),
                          heartbeat_s=HEARTBEAT_S))
        yield Running(peer, launcher)
    finally:
        if not launcher.exited():
            with contextlib.suppress(WorkerError):
                transport.send("w0", Shutdown(reason="test over"))
        launcher.stop(timeout_s=10)
        print(launcher.stderr_tail("w0"))  # shown by pytest when the test failed
        transport.close()
        store.cleanup()


def long_batch(n: int = 128, length: int = 128) -> list[TrainSeq]:
    g = torch.Generator().manual_seed(1)
    seqs = []
    for i in range(n):
        ids = torch.randint(3, VOCAB, (length,), generator=g).tolist()
        seqs.append(TrainSeq(job_id=i, prompt_ids=ids[:16], response_ids=ids[16:],
                             logprobs=[-6.0] * (length - 16), versions=[0] * (length - 16),
                             advantage=1.0 if i % 2 else -1.0))
    return seqs


def assert_heard_throughout(peer: Peer, start: float, end: float) -> None:
    """Heartbeats came on time from ``start`` to ``end``: never a silence near TIMEOUT_S."""
    beats = peer.beats(start, end)
    edges = [start, *beats, end]
    gaps = [b - a for a, b in zip(edges, edges[1:], strict=False)]
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    print(f"{end - start:.2f}s busy: {len(beats)} heartbeats, longest silence {gaps[worst]:.3f}s")
    assert gaps[worst] < TIMEOUT_S / 2, (
        f"silent for {gaps[worst]:.2f}s from {edges[worst] - start:.2f}s of {end - start:.2f}s "
        f"({len(beats)} heartbeats)")
    assert len(beats) >= int((end - start) / HEARTBEAT_S / 3), (len(beats), end - start)


async def test_a_train_step_of_many_timeouts_keeps_heartbeating(worker: Running) -> None:
    peer = worker.peer
    sent = peer.send(AssignRole(role="train", model="policy", options={"lr": 1e-4}))
    ready = await peer.next(RoleReady, after=sent)
    assert ready.msg.role == "train" and ready.msg.version == 0
    assert_heard_throughout(peer, sent, ready.at)

    seqs = long_batch()
    sent = peer.send(TrainStep(step=0, seqs=seqs))
    done = await peer.next(TrainDone, after=sent, timeout_s=400)
    took = done.at - sent
    assert took > 3 * TIMEOUT_S, f"the step took {took:.2f}s: too short to test anything"
    assert done.msg.version == 1 and done.msg.job_ids == [s.job_id for s in seqs]
    assert_heard_throughout(peer, sent, done.at)
    busy = [h.msg.busy for h in peer.heard
            if isinstance(h.msg, Heartbeat) and sent + HEARTBEAT_S < h.at < done.at - 0.05]
    assert busy and all(busy), busy  # the worker says it is busy while it trains


async def test_an_abort_mid_batch_is_answered_between_engine_steps(worker: Running) -> None:
    peer = worker.peer
    sent = peer.send(AssignRole(role="generate", model="policy", options={"max_batch": 8}))
    await peer.next(RoleReady, after=sent)
    max_tokens = 1200
    jobs = [GenerateJob(job_id=i, prompt_ids=[5 + i, 7, 9], max_tokens=max_tokens,
                        min_tokens=max_tokens, seed=i) for i in range(8)]
    started = peer.send(Jobs(jobs=jobs))
    # mid-batch: the worker has been generating for a while (and says so)
    await asyncio.sleep(1.0)
    assert any(h.msg.busy for h in peer.heard
               if isinstance(h.msg, Heartbeat) and h.at > started + 0.5)
    aborted = peer.send(AbortJobs(job_ids=[]))
    answer = await peer.next(JobsDone, after=aborted)
    results = {r.job_id: r for r in answer.msg.results}
    assert set(results) == set(range(8))
    assert all(r.finish_reason == "abort" for r in results.values())
    # partial: the batch was far from done when the abort came, and was answered at once
    # (how soon it came is no test on a shared machine: that each is partial says it came
    # between engine steps, not after the batch)
    assert all(0 < len(r.token_ids) < max_tokens for r in results.values()), \
        [len(r.token_ids) for r in results.values()]
    assert_heard_throughout(peer, started, answer.at)


async def test_shutdown_during_a_long_step_exits_promptly(worker: Running) -> None:
    peer = worker.peer
    sent = peer.send(AssignRole(role="train", model="policy", options={}))
    await peer.next(RoleReady, after=sent)
    sent = peer.send(TrainStep(step=0, seqs=long_batch()))
    # the step is under way: the worker heartbeats busy
    deadline = time.monotonic() + 30
    while not any(h.msg.busy for h in peer.heard
                  if isinstance(h.msg, Heartbeat) and h.at > sent):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    stop = peer.send(Shutdown(reason="run finished"))
    while not worker.launcher.exited():
        assert time.monotonic() - stop < 60, "the worker did not exit after Shutdown"
        await asyncio.sleep(0.05)
    [(_, code)] = worker.launcher.exited()
    assert code == 0
    # it did not wait for the step: no result, and it says so (a wall-time bound would not
    # tell a prompt exit from a step that finished early on a fast machine)
    assert not any(isinstance(h.msg, TrainDone) for h in peer.heard)
    assert "exiting without waiting for its current step" in worker.launcher.stderr_tail("w0")


async def test_an_error_in_compute_is_a_worker_failed(worker: Running) -> None:
    peer = worker.peer
    sent = peer.send(AssignRole(role="generate", model="policy", options={}))
    await peer.next(RoleReady, after=sent)
    sent = peer.send(TrainStep(step=0, seqs=long_batch(2, 20)))
    failed = await peer.next(WorkerFailed, after=sent)
    assert "WorkerError: worker w0 got a train step without the train role" in failed.msg.error
    deadline = time.monotonic() + 10
    while not worker.launcher.exited():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert worker.launcher.exited() == [("w0", 1)]


async def test_a_garbage_frame_is_counted_and_dropped_and_the_worker_keeps_serving(
        worker: Running) -> None:
    peer = worker.peer
    transport = peer.transport
    # raw bytes on the controller's ROUTER, past its typed encoder: what a buggy or hostile
    # controller-side peer could put on the wire
    sock = transport._sock
    assert sock is not None
    for garbage in (b"\xff\x00not msgpack", b"\x92\xa3Bad\x01"):
        sock.send(transport.admission.identity_of("w0"), zmq.SNDMORE)
        sock.send(garbage)
    sent = peer.send(AssignRole(role="generate", model="policy", options={}))
    ready = await peer.next(RoleReady, after=sent)
    assert ready.msg.role == "generate"  # still serving, in order after the garbage
    jobs = [GenerateJob(job_id=7, prompt_ids=[5, 7, 9], max_tokens=4, seed=1)]
    sent = peer.send(Jobs(jobs=jobs))
    done = await peer.next(JobsDone, after=sent)
    assert [r.job_id for r in done.msg.results] == [7]
    assert not worker.launcher.exited()
    log_text = worker.launcher.stderr_tail("w0", 20000)
    assert "2 dropped so far" in log_text, log_text
