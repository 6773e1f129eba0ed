"""The simulator's fast paths: the in-process transport without the codec, compact token ids,
and the seeded draws of simulated lengths."""

from __future__ import annotations

import asyncio

import pytest

from pivotflow.errors import ProtocolError
from pivotflow.protocol import PROTOCOL_VERSION, GenerateJob, Heartbeat, Hello, Jobs, Shutdown
from pivotflow.sim.outputs import unit
from pivotflow.sim.tokens import SimTokenizer
from pivotflow.tokenizer import default_tokenizer
from pivotflow.transport.local import LocalHub


def test_without_codec_messages_arrive_as_sent_in_order_and_later() -> None:
    async def main() -> None:
        hub = LocalHub(codec=False)
        got: list[object] = []
        end = hub.connect("w0")
        hello = Hello(protocol_version=PROTOCOL_VERSION, worker_id="w0", pid=1)
        end.send(hello)  # before start: queued
        hub.controller.start(lambda w, m: got.append(m))
        beats = [Heartbeat(worker_id="w0", busy=i) for i in range(20)]
        for b in beats:
            end.send(b)
        assert got == []  # nothing is delivered inside start or send
        await asyncio.sleep(0)
        assert got[0] is hello and all(a is b for a, b in zip(got[1:], beats, strict=True))
        jobs = Jobs(jobs=[GenerateJob(job_id=1, prompt_ids=[1], max_tokens=2)])
        seen: list[object] = []
        end.on_message = seen.append  # the simulated worker's way: a callback, no inbox
        hub.controller.send("w0", jobs)
        hub.controller.send("w0", Shutdown(reason="x"))
        assert seen == []
        await asyncio.sleep(0)
        assert seen[0] is jobs and isinstance(seen[1], Shutdown) and end.inbox.empty()
        with pytest.raises(ProtocolError, match="Hello is not a message"):
            hub.controller.send("w0", hello)  # type: ignore[arg-type]  # wrong direction
        with pytest.raises(ProtocolError, match="Jobs is not a message"):
            end.send(jobs)  # type: ignore[arg-type]
        assert (hub.controller.frames_in, hub.controller.frames_out) == (21, 2)

    asyncio.run(main())


def test_compact_ids_are_the_char_tokenizers_ids_as_bytes() -> None:
    ref, compact = default_tokenizer(), SimTokenizer(compact=True)
    text = "12+34=46\nok"
    ids = compact.encode(text, add_special_tokens=True)
    assert isinstance(ids, bytes) and list(ids) == ref.encode(text, add_special_tokens=True)
    assert compact.decode(ids) == ref.decode(list(ids)) == text
    assert isinstance(SimTokenizer().encode(text), list)  # the default stays a list


def test_length_draws_are_seeded_and_uniform() -> None:
    draws = [unit(s) for s in range(4000)]
    assert draws == [unit(s) for s in range(4000)]
    assert all(0 < u < 1 for u in draws)
    assert abs(sum(draws) / len(draws) - 0.5) < 0.02
    assert sum(u < 0.1 for u in draws) == pytest.approx(400, abs=60)
    assert unit(7, 1) != unit(7)  # a salt gives an independent draw (the verdict)
