"""Issue 27's takeover of a worker's identity, on real processes and sockets: a Hello or any
frame claiming a registered worker id from another connection or key is refused, counted per
sender and logged; a Hello without the run's token registers nothing; a refused peer gets a
bare "refused" and never a Welcome, a role or a job."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from pivotflow.protocol import (
    PROTOCOL_VERSION,
    GenerateJob,
    Heartbeat,
    Hello,
    Jobs,
    JobsDone,
    Reject,
    ToController,
    Welcome,
)
from pivotflow.transport.admission import TOKEN_ENV, new_run_secret, worker_token
from pivotflow.transport.codec import decode_to_worker, encode
from pivotflow.transport.curve import configure_client, keygen, load_controller_keys
from pivotflow.transport.curve import load_worker_keys as worker_keys
from pivotflow.transport.zmq_transport import ZmqControllerTransport

pytestmark = pytest.mark.timeout(90)

WORKER = Path(__file__).with_name("id_worker.py")


class Controller:
    """The controller's part the tests need: Welcome every Hello the transport delivers."""

    def __init__(self, t: ZmqControllerTransport) -> None:
        self.t = t
        self.got: list[tuple[str, ToController]] = []

    def __call__(self, worker_id: str, msg: ToController) -> None:
        self.got.append((worker_id, msg))
        if isinstance(msg, Hello):
            self.t.send(worker_id, Welcome(protocol_version=PROTOCOL_VERSION, store_dir="/s"))

    async def wait_for(self, cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            assert time.monotonic() < deadline, f"timed out; got {self.got}"
            await asyncio.sleep(0.02)


def _spawn(endpoint: str, worker_id: str, token: str, *key: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, **{TOKEN_ENV: token})
    return subprocess.Popen([sys.executable, str(WORKER), endpoint, worker_id, *key], env=env)


class Stranger:
    """A peer on the same endpoint that picks its own identity (and key)."""

    def __init__(self, ctx: zmq.Context, endpoint: str, identity: bytes,
                 keys: object = None) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.IDENTITY, identity)
        if keys is not None:
            configure_client(self.sock, keys)  # type: ignore[arg-type]
        self.sock.connect(endpoint)

    def hello(self, worker_id: str, token: str = "") -> None:
        self.sock.send(encode(Hello(protocol_version=PROTOCOL_VERSION, worker_id=worker_id,
                                    pid=1, token=token)))

    def received(self, wait_s: float = 0.5) -> list[object]:
        out = []
        while self.sock.poll(int(wait_s * 1000)):
            out.append(decode_to_worker(self.sock.recv()))
            wait_s = 0.05
        return out


def _jobs(*ids: int) -> Jobs:
    return Jobs(jobs=[GenerateJob(job_id=i, prompt_ids=[1], max_tokens=1) for i in ids])


async def _takeover(t: ZmqControllerTransport, secret: bytes, worker_key: tuple[str, ...],
                    stranger_keys: object) -> None:
    ctl = Controller(t)
    t.start(ctl)
    real = _spawn(t.endpoint, "w1", worker_token(secret, "w1"), *worker_key)
    ctx = zmq.Context()
    try:
        await ctl.wait_for(lambda: any(isinstance(m, Hello) for _, m in ctl.got))
        # impostors: the live id with another nonce, the bare id; even the right token
        thieves = [Stranger(ctx, t.endpoint, ident, stranger_keys)
                   for ident in (b"w1#evil", b"w1")]
        for s in thieves:
            s.hello("w1", worker_token(secret, "w1"))
            s.sock.send(encode(JobsDone(results=[])))
        await ctl.wait_for(lambda: t.admission.impostor_frames >= 4)
        t.send("w1", _jobs(1, 2))  # the real worker answers; no impostor sees them
        await ctl.wait_for(lambda: any(isinstance(m, JobsDone) for _, m in ctl.got))
        for s in thieves:
            got = await asyncio.to_thread(s.received)
            assert got == [Reject(reason="refused")], got
        assert [w for w, _ in ctl.got] == ["w1", "w1"]
        assert t.admission.counters()["by_sender"]["impostor_frames"] == {"w1#evil": 2, "w1": 2}
        t.send("w1", _jobs())  # empty: the real worker keeps serving
    finally:
        real.kill()
        real.wait()
        ctx.destroy(linger=0)


def test_impostor_with_a_live_id_on_plain_tcp(caplog: pytest.LogCaptureFixture) -> None:
    secret = new_run_secret()
    with ZmqControllerTransport("tcp://127.0.0.1:*", worker_secret=secret) as t:
        asyncio.run(_takeover(t, secret, (), None))
    assert "claims worker 'w1', registered from another connection" in caplog.text


def test_impostor_with_another_allowed_curve_key(tmp_path: Path) -> None:
    keygen(tmp_path, ["real", "other"])
    secret = new_run_secret()
    with ZmqControllerTransport("tcp://127.0.0.1:*", worker_secret=secret,
                                curve=load_controller_keys(tmp_path)) as t:
        asyncio.run(_takeover(t, secret, (str(tmp_path), "real"), worker_keys(tmp_path, "other")))


def test_a_known_identity_with_another_key_is_refused(tmp_path: Path) -> None:
    """Bound to the key too: the same identity reconnecting with another allowed key is
    refused; with its own key (a reconnect) it is served again."""
    keygen(tmp_path, ["a", "b"])
    secret = new_run_secret()

    async def main(t: ZmqControllerTransport) -> None:
        ctl = Controller(t)
        t.start(ctl)
        ctx = zmq.Context()
        try:
            first = Stranger(ctx, t.endpoint, b"w3#n1", worker_keys(tmp_path, "a"))
            first.hello("w3", worker_token(secret, "w3"))
            assert isinstance((await asyncio.to_thread(first.received, 5.0))[0], Welcome)
            first.sock.close(linger=0)
            await asyncio.sleep(0.3)  # its connection is gone: the identity is free in libzmq
            other = Stranger(ctx, t.endpoint, b"w3#n1", worker_keys(tmp_path, "b"))
            other.sock.send(encode(Heartbeat(worker_id="w3")))
            await ctl.wait_for(lambda: t.admission.impostor_frames == 1)
            other.sock.close(linger=0)
            await asyncio.sleep(0.3)
            again = Stranger(ctx, t.endpoint, b"w3#n1", worker_keys(tmp_path, "a"))
            again.sock.send(encode(Heartbeat(worker_id="w3", busy=7)))
            await ctl.wait_for(lambda: any(isinstance(m, Heartbeat) for _, m in ctl.got))
            assert ctl.got[-1] == ("w3", Heartbeat(worker_id="w3", busy=7))
            assert t.admission.impostor_frames == 1
        finally:
            ctx.destroy(linger=0)

    with ZmqControllerTransport("tcp://127.0.0.1:*", worker_secret=secret,
                                curve=load_controller_keys(tmp_path)) as t:
        asyncio.run(main(t))


def test_hello_without_the_runs_token_registers_nothing() -> None:
    secret = new_run_secret()

    async def main(t: ZmqControllerTransport) -> None:
        ctl = Controller(t)
        t.start(ctl)
        ctx = zmq.Context()
        try:
            s = Stranger(ctx, t.endpoint, b"w2#x")
            s.sock.send(encode(Heartbeat(worker_id="w2")))  # before any Hello
            s.hello("w2")  # no token
            s.hello("w2", "0" * 64)  # a wrong one
            s.hello("w2", worker_token(new_run_secret(), "w2"))  # another run's
            s.hello("w9", worker_token(secret, "w2"))  # w2's token for another id
            await ctl.wait_for(lambda: t.admission.refused_hellos == 4)
            got = await asyncio.to_thread(s.received)
            assert got == [Reject(reason="refused")] * 4, got  # nothing about why, or the store
            assert t.admission.unregistered_frames == 1 and ctl.got == []
            by = t.admission.counters()["by_sender"]
            assert by == {"unregistered_frames": {"w2#x": 1}, "refused_hellos": {"w2#x": 4}}
            # the refusals bound nothing: the launched worker registers as usual
            real = _spawn(t.endpoint, "w2", worker_token(secret, "w2"))
            try:
                await ctl.wait_for(lambda: [w for w, _ in ctl.got] == ["w2"])
                t.send("w2", _jobs(5))
                await ctl.wait_for(lambda: len(ctl.got) == 2)
                assert isinstance(ctl.got[1][1], JobsDone)
            finally:
                real.kill()
                real.wait()
        finally:
            ctx.destroy(linger=0)

    with ZmqControllerTransport("tcp://127.0.0.1:*", worker_secret=secret) as t:
        asyncio.run(main(t))
