"""Wire fuzz: random and malformed frames from several DEALERs against a real controller ROUTER.

Run: python bench/fuzz_wire.py [--n 100000] [--senders 4] [--seed 0]

Each sender thread sends its share of ``n`` frames drawn from the kinds below (random bytes,
truncated valid frames, msgpack of the wrong types, deep nesting, huge declared lengths, unknown
tags, worker-bound messages, extra parts, oversized frames, a pickle whose ``__reduce__`` would
create a file, wrong-version Hellos, and valid messages) to a ZmqControllerTransport on ipc; one
sender lets the ROUTER pick its identity. Then raw sockets speak broken ZMTP to the socket
file, and a real worker must still get its Hello answered. Checked: every frame is counted
(sent == bad + delivered, per kind and per sender), the file does not exist, the log stays
bounded. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import pickle
import random
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from pivotflow.protocol import (
    PROTOCOL_VERSION,
    AbortJobs,
    GenerateJob,
    Heartbeat,
    Hello,
    JobDone,
    Jobs,
    JobsDone,
    RoleReady,
    ToController,
    ToWorker,
    TrainDone,
    Welcome,
    WorkerFailed,
)
from pivotflow.transport.codec import encode
from pivotflow.transport.zmq_transport import ZmqControllerTransport, ZmqWorkerChannel

# The fuzzed transport's frame limit: small, so oversized frames are cheap to make.
MAX_FRAME = 64 * 1024
_msgpack = msgspec.msgpack.Encoder()
Parts = list[bytes]


class CreatesFile:
    """Unpickling this opens (creates) ``path``: the side effect that must never happen."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def _valid(rng: random.Random) -> ToController:
    k = rng.randrange(1, 6)
    done = JobDone(job_id=k, token_ids=[3] * k, logprobs=[-0.5] * k, versions=[1] * k,
                   finish_reason="length")  # fmt: skip
    choices: list[ToController] = [
        Heartbeat(worker_id=f"w{k}", busy=rng.randrange(100)),
        RoleReady(role="generate", model="policy", version=k),
        JobsDone(results=[done] * k),
        TrainDone(step=k, version=k + 1, stats={"loss": 0.5}, job_ids=list(range(k))),
        WorkerFailed(error="boom", job_ids=[k]),
        Hello(protocol_version=PROTOCOL_VERSION, worker_id=f"w{k}", pid=k),
    ]
    return rng.choice(choices)


_WRONG_TYPES = [
    {"type": "Hello", "protocol_version": "one", "worker_id": "x", "pid": 1},
    {"type": "Heartbeat", "worker_id": 1 << 40},
    {"type": "TrainDone", "step": 1, "version": 2, "stats": {"loss": "low"}, "job_ids": []},
    {"type": "WorkerFailed", "error": None},
    {"type": 7},
    {"type": "Heartbeat", "worker_id": "x", "busy": 1.5},
    ["JobsDone", "not a list"],
    ["JobsDone", [[1, [3], [-0.5], [1]]]],
    ["JobsDone", [[1, [3], ["x"], [1], "length"]]],
    [0.5, 0.25],
    {"0.5": 1},
    [],
    {},
]
_WRONG_TYPE_FRAMES = [_msgpack.encode(v) for v in _WRONG_TYPES]
# msgpack heads that declare far more than follows: array32, map32, str32, bin32, ext32.
_HUGE_HEADS = [b"\xdd", b"\xdf", b"\x92\xa8JobsDone\xdd", b"\x81\xa4type\xdb",
               b"\x84\xa4type\xa5Hello\xa9worker_id\xdb", b"\x81\xa4type\xc6",
               b"\x81\xa4type\xc9"]  # fmt: skip
_HUGE_LENGTHS = [b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x00\x10\x00\x00"]
# (prefix, repeated unit, units per depth step): nested arrays/maps, bare or inside a message.
_NESTINGS = [(b"", b"\x91", 1), (b"", b"\x81\xa1a", 3), (b"\x92\xa8JobsDone", b"\x91", 1),
             (b"\x85\xa4type\xa9TrainDone\xa5stats", b"\x81\xa1a", 3)]  # fmt: skip
_UNKNOWN_TAGS = ["NoSuchMessage", "", "hello", "Hello ", "\u00e9", "Reject", "Jobs"]
_WORKER_BOUND: list[ToWorker] = [
    Jobs(jobs=[GenerateJob(job_id=1, prompt_ids=[3, 4], max_tokens=4)]),
    Welcome(protocol_version=PROTOCOL_VERSION, store_dir="/"),
    AbortJobs(),
]


def _random_bytes(rng: random.Random, _: str) -> Parts:
    return [rng.randbytes(rng.randrange(1, 300))]


def _truncated(rng: random.Random, _: str) -> Parts:
    # A strict prefix of one msgpack object never decodes (the whole would have trailing bytes).
    frame = encode(_valid(rng))
    return [frame[: rng.randrange(1, len(frame))]]


def _wrong_types(rng: random.Random, _: str) -> Parts:
    return [rng.choice(_WRONG_TYPE_FRAMES)]


def _deep(rng: random.Random, _: str) -> Parts:
    prefix, unit, step = rng.choice(_NESTINGS)
    return [prefix + unit * (rng.randrange(1_000, 20_000) // step) + b"\xc0"]


def _huge_lengths(rng: random.Random, _: str) -> Parts:
    head = rng.choice(_HUGE_HEADS) + rng.choice(_HUGE_LENGTHS)
    return [head + rng.randbytes(rng.randrange(0, 16))]


def _unknown_tag(rng: random.Random, _: str) -> Parts:
    tag = rng.choice(_UNKNOWN_TAGS)
    return [_msgpack.encode(rng.choice([{"type": tag, "worker_id": "x"}, [tag, 1, 2]]))]


def _worker_bound(rng: random.Random, _: str) -> Parts:
    return [encode(rng.choice(_WORKER_BOUND))]


def _extra_parts(rng: random.Random, _: str) -> Parts:
    return [encode(_valid(rng))] + [b"x"] * rng.randrange(1, 4)


def _empty(rng: random.Random, _: str) -> Parts:
    return [b""]


def _oversized(rng: random.Random, _: str) -> Parts:
    # Over MAX_FRAME but under the transport's hard limit (2x): read, counted, dropped.
    return [encode(Heartbeat(worker_id="x" * rng.randrange(MAX_FRAME, 2 * MAX_FRAME - 64)))]


def _pickle(rng: random.Random, path: str) -> Parts:
    return [pickle.dumps(CreatesFile(path), protocol=rng.randrange(0, pickle.HIGHEST_PROTOCOL + 1))]


def _wrong_version(rng: random.Random, _: str) -> Parts:
    v = rng.choice([0, PROTOCOL_VERSION + 1, 99, -1, 2**40])
    return [encode(Hello(protocol_version=v, worker_id="old", pid=1))]


def _valid_frame(rng: random.Random, _: str) -> Parts:
    return [encode(_valid(rng))]


# kind -> (weight, maker, delivered?); delivered kinds decode and reach the handler.
KINDS: dict[str, tuple[float, Callable[[random.Random, str], Parts], bool]] = {
    "random_bytes": (20, _random_bytes, False),
    "truncated": (20, _truncated, False),
    "wrong_types": (15, _wrong_types, False),
    "deep_nesting": (2, _deep, False),
    "huge_declared_length": (8, _huge_lengths, False),
    "unknown_tag": (8, _unknown_tag, False),
    "worker_bound": (4, _worker_bound, False),
    "extra_parts": (4, _extra_parts, False),
    "empty": (1, _empty, False),
    "oversized": (0.3, _oversized, False),
    "pickle": (5, _pickle, False),
    "wrong_version_hello": (3, _wrong_version, True),
    "valid": (5, _valid_frame, True),
}


def _sender(
    endpoint: str,
    identity: bytes | None,
    n: int,
    seed: int,
    path: str,
    sent: Counter[str],
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    rng = random.Random(seed)
    names = list(KINDS)
    weights = [KINDS[k][0] for k in names]
    sock = ctx.socket(zmq.DEALER)
    try:
        # Linger, or frames still queued when the last send returns would be dropped at close.
        sock.setsockopt(zmq.LINGER, 30_000)
        if identity is not None:
            sock.setsockopt(zmq.IDENTITY, identity)
        sock.connect(endpoint)
        for kind in rng.choices(names, weights, k=n):
            sock.send_multipart(KINDS[kind][1](rng, path))
            sent[kind] += 1
    finally:
        sock.close()


# ZMTP 3.0: a 64-byte greeting (NULL mechanism, not as-server), then a READY command.
_GREETING = b"\xff" + b"\x00" * 8 + b"\x7f\x03\x00NULL" + b"\x00" * 16 + b"\x00" * 32
_READY_BODY = b"\x05READY\x0bSocket-Type" + (6).to_bytes(4, "big") + b"DEALER"
_READY = b"\x04" + bytes([len(_READY_BODY)]) + _READY_BODY


def _raw_zmtp(path: str, rng: random.Random, conns: int) -> None:
    """Connect to the ipc socket file directly and send broken ZMTP (never a zmq message)."""
    huge = (2**62).to_bytes(8, "big")
    for _ in range(conns):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(path)
            s.sendall(
                rng.choice(
                    [
                        rng.randbytes(rng.randrange(1, 512)),  # not even a greeting
                        _GREETING + b"\x06" + huge + b"x" * 64,  # a command that claims 2**62 bytes
                        _GREETING + _READY + b"\x02" + huge + b"x" * 64,  # a message that does
                        _GREETING + _READY + b"\x00\xff" + b"x" * 16,  # a message cut short
                    ]
                )
            )


async def fuzz(
    n: int = 100_000, senders: int = 4, seed: int = 0, raw_conns: int = 100
) -> dict[str, Any]:
    """Run the fuzz; returns the counts (see the module docstring). Raises TimeoutError if the
    transport stops counting frames."""
    loop = asyncio.get_running_loop()
    workdir = tempfile.mkdtemp(prefix="pivotflow-fuzz-")
    target = os.path.join(workdir, "pwned")
    endpoint = f"ipc://{workdir}/ctl.sock"
    delivered: Counter[str] = Counter()
    lines: list[logging.LogRecord] = []
    log_capture = _Capture(lines)
    logging.getLogger("pivotflow.transport.zmq_transport").addHandler(log_capture)

    def handler(worker_id: str, msg: ToController) -> None:
        # What the controller does with a Hello of another version: refuse it (by Reject).
        if isinstance(msg, Hello) and msg.protocol_version != PROTOCOL_VERSION:
            delivered["version_mismatch"] += 1
        else:
            delivered[type(msg).__name__] += 1

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        with ZmqControllerTransport(endpoint, max_frame_bytes=MAX_FRAME) as t:
            t.start(handler)
            share = [n // senders + (i < n % senders) for i in range(senders)]
            ids = [f"fuzz-{i}".encode() for i in range(senders - 1)] + [None]
            sent: list[Counter[str]] = [Counter() for _ in range(senders)]
            t0 = time.perf_counter()
            threads = [
                threading.Thread(
                    target=_sender,
                    args=(endpoint, ids[i], share[i], seed * 1000 + i, target, sent[i], ctx),
                )
                for i in range(senders)
            ]
            for th in threads:
                th.start()
            counted, last_progress = 0, time.perf_counter()
            while any(th.is_alive() for th in threads) or counted < n:
                if not any(th.is_alive() for th in threads) and sum(c.total() for c in sent) < n:
                    raise RuntimeError("a sender thread failed (its traceback is above)")
                if t.bad_frames + t.frames_in > counted:
                    counted, last_progress = t.bad_frames + t.frames_in, time.perf_counter()
                elif time.perf_counter() - last_progress > 10:
                    raise TimeoutError(f"counting stalled at {counted} of {n} frames")
                await asyncio.sleep(0.02)
            elapsed = time.perf_counter() - t0
            bad, frames_in = t.bad_frames, t.frames_in
            bad_by_sender = dict(t.bad_frames_by_sender)
            for th in threads:
                th.join()
            await loop.run_in_executor(
                None, _raw_zmtp, endpoint[len("ipc://") :], random.Random(seed), raw_conns
            )
            served = await _serve_one(t, endpoint)
            by_kind = sum(sent, Counter())
            return {
                "bench": "fuzz_wire",
                "frames_sent": n,
                "bad_counted": bad,
                "delivered": frames_in,
                "expected_bad": sum(c for k, c in by_kind.items() if not KINDS[k][2]),
                "version_mismatch": delivered["version_mismatch"],
                "sent_by_kind": dict(sorted(by_kind.items())),
                "bad_by_sender": bad_by_sender,
                "expected_bad_by_sender": {
                    (ids[i] or b"").decode(): sum(c for k, c in sent[i].items() if not KINDS[k][2])
                    for i in range(senders)
                },
                "raw_zmtp_connections": raw_conns,
                # libzmq still speaks ZMTP 1.0, where raw bytes are frames: counted, never served.
                "raw_zmtp_bad_frames": t.bad_frames - bad,
                "raw_zmtp_delivered": t.frames_in - frames_in - served,
                "served_after": served,
                "log_lines": len(lines),
                # first to last warning: the limiter allows 10 lines per 10 s window in it
                "log_span_s": round(lines[-1].created - lines[0].created, 3) if lines else 0.0,
                "elapsed_s": round(elapsed, 3),
                "frames_per_s": round(n / elapsed),
                "file_created": os.path.exists(target),
            }
    finally:
        ctx.term()
        logging.getLogger("pivotflow.transport.zmq_transport").removeHandler(log_capture)
        if os.path.exists(target):
            os.unlink(target)
        for name in os.listdir(workdir):
            os.unlink(os.path.join(workdir, name))
        os.rmdir(workdir)


async def _serve_one(t: ZmqControllerTransport, endpoint: str) -> bool:
    """A real worker says Hello and gets its Welcome: the transport still serves both ways."""
    loop = asyncio.get_running_loop()
    before = t.frames_in
    with ZmqWorkerChannel(endpoint, "survivor") as ch:
        ch.send(Hello(protocol_version=PROTOCOL_VERSION, worker_id="survivor", pid=os.getpid()))
        deadline = time.perf_counter() + 10
        while t.frames_in == before and time.perf_counter() < deadline:
            await asyncio.sleep(0.01)
        welcome = Welcome(protocol_version=PROTOCOL_VERSION, store_dir="/gps")
        t.send("survivor", welcome)
        return await loop.run_in_executor(None, ch.recv, 10.0) == welcome


class _Capture(logging.Handler):
    def __init__(self, sink: list[logging.LogRecord]) -> None:
        super().__init__(logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.getLogger("pivotflow").propagate = False  # the bench prints JSON, not the warnings
    try:
        import uvloop  # the controller's loop when installed
    except ImportError:
        loop = asyncio.new_event_loop()
    else:
        loop = uvloop.new_event_loop()
    try:
        out = loop.run_until_complete(fuzz(args.n, args.senders, args.seed))
    finally:
        loop.close()
    out["loop"] = type(loop).__module__.split(".")[0]
    ok = (
        out["raw_zmtp_delivered"] == 0
        and out["bad_counted"] + out["delivered"] == out["frames_sent"]
        and out["bad_counted"] == out["expected_bad"]
        and sum(out["bad_by_sender"].values()) == out["bad_counted"]
        and not out["file_created"]
        and out["served_after"]
    )
    out["ok"] = ok
    print(
        f"{out['frames_sent']} frames in {out['elapsed_s']} s ({out['frames_per_s']}/s): "
        f"{out['bad_counted']} bad, {out['delivered']} delivered, ok={ok}"
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
