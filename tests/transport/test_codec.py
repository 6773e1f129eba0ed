"""The codec: every message round-trips; every kind of bad frame is a ProtocolError."""

from __future__ import annotations

import contextlib
import logging
import pickle
import random
import time
import typing
from pathlib import Path

import msgspec
import pytest

from pivotflow.errors import ProtocolError
from pivotflow.protocol import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    AbortJobs,
    AssignRole,
    GenerateJob,
    Heartbeat,
    Hello,
    JobDone,
    Jobs,
    JobsDone,
    Reject,
    RoleReady,
    Shutdown,
    ToController,
    ToWorker,
    TrainDone,
    TrainSeq,
    TrainStep,
    Welcome,
    WorkerFailed,
)
from pivotflow.transport.codec import (
    BadFrameLog,
    decode_to_controller,
    decode_to_worker,
    encode,
    encode_into,
)

JOB = GenerateJob(
    job_id=7,
    prompt_ids=[1, 5, 9],
    max_tokens=16,
    temperature=0.7,
    top_p=0.9,
    seed=3,
    stop_token_ids=[2],
    stop_strings=["\n\n"],
    prefix_ids=[11, 12],
    prefix_logprobs=[-0.25, -1.5],
    prefix_versions=[4, 4],
    min_version=4,
)
DONE = JobDone(
    job_id=7,
    token_ids=[11, 12, 2],
    logprobs=[-0.25, -1.5, -0.1],
    versions=[4, 4, 5],
    finish_reason="stop",
)

TO_CONTROLLER: list[ToController] = [
    Hello(protocol_version=PROTOCOL_VERSION, worker_id="w0", pid=123),
    Heartbeat(worker_id="w0", busy=3),
    RoleReady(role="generate", model="policy", version=5, load_s=0.5),
    JobsDone(
        results=[
            DONE,
            JobDone(
                job_id=8, token_ids=[], logprobs=[], versions=[], finish_reason="abort", error="x"
            ),
        ]
    ),
    JobsDone(results=[]),
    TrainDone(step=1, version=2, stats={"loss": 0.5, "kl": 0.01}, job_ids=[7, 8]),
    WorkerFailed(error="boom", job_ids=[1, 2]),
]
TO_WORKER: list[ToWorker] = [
    Welcome(protocol_version=PROTOCOL_VERSION, store_dir="/tmp/gps", heartbeat_s=0.5),
    Reject(reason="protocol 2 != 1"),
    AssignRole(
        role="generate", model="policy", options={"batch": 8, "temp": 1.0, "name": "a", "on": True}
    ),
    Jobs(jobs=[JOB, GenerateJob(job_id=8, prompt_ids=[1], max_tokens=1)]),
    AbortJobs(job_ids=[7]),
    AbortJobs(),
    TrainStep(
        step=3,
        seqs=[
            TrainSeq(
                job_id=7,
                prompt_ids=[1],
                response_ids=[5, 2],
                logprobs=[-1.0, -0.5],
                versions=[3, 3],
                advantage=0.75,
                loss_mask=[1, 1],
            )
        ],
    ),
    Shutdown(reason="done"),
]


def test_every_union_member_is_covered() -> None:
    # A message added to the protocol without a round-trip case here fails this test.
    assert {type(m) for m in TO_CONTROLLER} == set(typing.get_args(ToController))
    assert {type(m) for m in TO_WORKER} == set(typing.get_args(ToWorker))


@pytest.mark.parametrize("msg", TO_CONTROLLER, ids=lambda m: type(m).__name__)
def test_to_controller_round_trip(msg: ToController) -> None:
    frame = encode(msg)
    assert decode_to_controller(frame) == msg
    assert decode_to_controller(memoryview(frame)) == msg
    buf = bytearray(b"leftover bytes that encode_into must replace")
    encode_into(msg, buf)
    assert bytes(buf) == frame
    # The other direction's decoder does not accept it.
    with pytest.raises(ProtocolError):
        decode_to_worker(frame)


@pytest.mark.parametrize("msg", TO_WORKER, ids=lambda m: type(m).__name__)
def test_to_worker_round_trip(msg: ToWorker) -> None:
    frame = encode(msg)
    assert decode_to_worker(frame) == msg
    with pytest.raises(ProtocolError):
        decode_to_controller(frame)


class _CreatesFile:
    """Unpickling this would create ``path``: the classic __reduce__ payload."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.path), "w"))


def _bad_frames(tmp_path: Path) -> dict[str, bytes]:
    enc = msgspec.msgpack.Encoder()
    good = encode(Heartbeat(worker_id="w0", busy=1))
    return {
        "empty": b"",
        "random": bytes(random.Random(0).randrange(256) for _ in range(64)),
        "truncated": good[:-3],
        "truncated_hot": encode(JobsDone(results=[DONE]))[:-5],
        "trailing_bytes": good + b"\x00",
        "unknown_tag": enc.encode({"type": "Evil", "worker_id": "w0"}),
        "unknown_tag_array": enc.encode(["Evil", []]),
        "no_tag": enc.encode({"worker_id": "w0"}),
        "wrong_field_type": enc.encode(
            {"type": "Hello", "protocol_version": "1", "worker_id": "w0", "pid": 1}
        ),
        "missing_field": enc.encode({"type": "Hello", "worker_id": "w0"}),
        "scalar": enc.encode(42),
        "pickle": pickle.dumps(_CreatesFile(tmp_path / "pwned")),
        "pickle_protocol0": pickle.dumps(_CreatesFile(tmp_path / "pwned"), protocol=0),
        "deep_array": b"\x92\xa8JobsDone" + b"\x91" * 200_000 + b"\xc0",
        "deep_unknown_field": b"\x82\xa4type\xa9Heartbeat\xa3zzz" + b"\x91" * 1_000_000 + b"\xc0",
        "huge_claimed_length": b"\x92\xa8JobsDone\xdd\xff\xff\xff\xff",
    }


def test_bad_frames_raise_protocol_error(tmp_path: Path) -> None:
    for name, frame in _bad_frames(tmp_path).items():
        for decode in (decode_to_controller, decode_to_worker):
            with pytest.raises(ProtocolError) as info:
                decode(frame)
            assert len(str(info.value)) < 300, name  # a short reason, not a dump
    assert not (tmp_path / "pwned").exists()  # nothing was ever unpickled


def test_every_prefix_of_a_frame_is_refused() -> None:
    frame = encode(Jobs(jobs=[JOB]))
    for cut in range(len(frame)):
        with pytest.raises(ProtocolError):
            decode_to_worker(frame[:cut])


def test_random_garbage_never_escapes_as_another_exception() -> None:
    rng = random.Random(1)
    valid = [encode(m) for m in TO_CONTROLLER]
    for _ in range(3000):
        frame = bytearray(rng.choice(valid))
        for _ in range(rng.randrange(1, 4)):  # flip a few bytes of a real frame
            frame[rng.randrange(len(frame))] = rng.randrange(256)
        with contextlib.suppress(ProtocolError):
            decode_to_controller(bytes(frame))


def test_oversized_frame_is_refused_before_decoding() -> None:
    frame = bytearray(MAX_FRAME_BYTES + 1)
    frame[:2] = b"\x81\xa4"  # looks like a map: only the size check can refuse it
    with pytest.raises(ProtocolError, match="MAX_FRAME_BYTES"):
        decode_to_controller(memoryview(frame))


def test_bad_frame_log_is_rate_limited_and_names_the_suppressed_senders() -> None:
    records: list[str] = []

    class Sink(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("test.badframes")
    logger.propagate = False
    logger.addHandler(Sink())
    bad_log = BadFrameLog(logger, burst=2, window_s=0.05)
    for i in range(50):
        bad_log.warn("t", f"peer{i % 6}".encode(), "junk")
    assert records == ["t: dropped a bad frame from 'peer0': junk",
                       "t: dropped a bad frame from 'peer1': junk"]  # fmt: skip
    time.sleep(0.06)  # a new window: the next line reports what was held back
    bad_log.warn("t", b"\xffbin", "junk")
    assert records[-1] == (
        "t: dropped a bad frame from '\\\\xffbin': junk (48 more bad frames not logged, "
        "from 'peer2', 'peer3', 'peer4', 'peer5', ...)"
    )
