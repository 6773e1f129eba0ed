"""The in-process transport: same protocol checks, same counters, async delivery, in order."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import uvloop

from pivotflow.errors import ProtocolError, TransportError, WorkerError
from pivotflow.protocol import (
    PROTOCOL_VERSION,
    GenerateJob,
    Heartbeat,
    Hello,
    JobDone,
    Jobs,
    JobsDone,
    Shutdown,
    ToController,
)
from pivotflow.transport.base import ControllerTransport
from pivotflow.transport.local import LocalHub

Run = Callable[[Coroutine[Any, Any, Any]], Any]


@pytest.fixture(params=["asyncio-debug", "uvloop"])
def run(request: pytest.FixtureRequest) -> Iterator[Run]:
    """Run a coroutine to completion on a fresh loop of the requested kind."""
    loops: list[asyncio.AbstractEventLoop] = []

    def _run(coro: Coroutine[Any, Any, Any]) -> Any:
        loop = uvloop.new_event_loop() if request.param == "uvloop" else asyncio.new_event_loop()
        loop.set_debug(request.param == "asyncio-debug")
        loops.append(loop)
        return loop.run_until_complete(asyncio.wait_for(coro, 20))

    try:
        yield _run
    finally:
        for loop in loops:
            loop.close()


def _hello(worker_id: str) -> Hello:
    return Hello(protocol_version=PROTOCOL_VERSION, worker_id=worker_id, pid=1)


def test_messages_flow_both_ways_in_order(run: Run) -> None:
    async def main() -> None:
        hub = LocalHub()
        transport: ControllerTransport = hub.controller  # the interface the controller uses
        got: list[tuple[str, ToController]] = []
        end = hub.connect("w0")
        end.send(_hello("w0"))  # before start: queued, as a DEALER's message would be
        hub.controller.start(lambda w, m: got.append((w, m)))
        assert got == []  # nothing is delivered inside start or send
        for i in range(100):
            end.send(Heartbeat(worker_id="w0", busy=i))
        await asyncio.sleep(0)
        assert got[0] == ("w0", _hello("w0"))
        assert [m.busy for _, m in got[1:]] == list(range(100))  # type: ignore[union-attr]
        for i in range(50):
            transport.send("w0", Jobs(jobs=[GenerateJob(job_id=i, prompt_ids=[1], max_tokens=2)]))
        assert end.inbox.empty()
        received = [await end.recv() for _ in range(50)]
        assert [m.jobs[0].job_id for m in received] == list(range(50))  # type: ignore[union-attr]
        ctl = hub.controller
        assert (ctl.frames_in, ctl.frames_out, ctl.bad_frames) == (101, 50, 0)
        ctl.close()

    run(main())


def test_bad_frames_are_counted_logged_and_dropped(
    run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        hub = LocalHub()
        got: list[ToController] = []
        hub.controller.start(lambda w, m: got.append(m))
        end = hub.connect("mallory")
        end.send_frame(b"\x00garbage")
        end.send_frame(b"")
        end.send(Jobs(jobs=[]))  # type: ignore[arg-type]  # a worker-bound message
        done = JobsDone(
            results=[
                JobDone(
                    job_id=1, token_ids=[5], logprobs=[-1.0], versions=[0], finish_reason="stop"
                )
            ]
        )
        end.send(done)
        await asyncio.sleep(0)
        assert got == [done]
        assert hub.controller.bad_frames == 3
        hub.controller.close()

    with caplog.at_level(logging.WARNING, logger="pivotflow.transport.local"):
        run(main())
    assert sum("'mallory'" in r.getMessage() for r in caplog.records) == 3


def test_unknown_or_closed_worker_raises(run: Run) -> None:
    async def main() -> None:
        hub = LocalHub()
        hub.controller.start(lambda w, m: None)
        with pytest.raises(WorkerError, match="'ghost'"):
            hub.controller.send("ghost", Shutdown())
        end = hub.connect("w1")
        hub.controller.send("w1", Shutdown(reason="a"))
        end.close()
        with pytest.raises(WorkerError, match="'w1'"):
            hub.controller.send("w1", Shutdown())
        with pytest.raises(TransportError):
            end.send(_hello("w1"))
        hub.controller.close()
        with pytest.raises(TransportError):
            hub.controller.send("w1", Shutdown())
        with pytest.raises(TransportError):
            hub.controller.start(lambda w, m: None)

    run(main())


def test_malformed_outgoing_message_fails_at_the_sender(run: Run) -> None:
    async def main() -> None:
        hub = LocalHub()
        hub.controller.start(lambda w, m: None)
        hub.connect("w0")
        # msgspec does not validate on construction; the codec round trip catches it.
        bad = Jobs(jobs=[GenerateJob(job_id="seven", prompt_ids=[1], max_tokens=2)])  # type: ignore[arg-type]
        with pytest.raises(ProtocolError):
            hub.controller.send("w0", bad)
        assert hub.controller.frames_out == 0

    run(main())
