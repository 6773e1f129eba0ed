"""The trainer pool's rate per size, as the planner sees it: measured in tokens, read in samples
at the tokens per sample of the work waiting, so a size measured on short samples does not
promise the same samples/s on long ones (a drifting run's responses grow severalfold). The
controller is the real one; the workers are TokenWorkers speaking the protocol (harness.py)."""

from __future__ import annotations

import asyncio
import random

import pytest
from harness import Harness, serving
from test_shifts import POOLS

from pivotflow.controller.planning import planner_view
from pivotflow.controller.sample import Sample
from pivotflow.controller.train_batch import TrainBuffer, group_tokens


def group(gid: int, prompt: int, response: int, size: int = 2) -> list[Sample]:
    return [Sample(gid * size + i, gid, size, 0, 0,
                   {"prompt_ids": [1] * prompt, "response_ids": [2] * response,
                    "versions": [0] * response})
            for i in range(size)]


def test_ready_tokens_follow_every_way_a_group_enters_or_leaves() -> None:
    rng = random.Random(0)
    buf = TrainBuffer(2, 1, partial=True)
    gid = 0
    for _ in range(200):
        op = rng.choice(["add", "add", "take", "requeue", "refuse"])
        if op == "add":
            g = group(gid, rng.randint(1, 9), rng.randint(0, 30))
            buf.admitted(gid, 0)
            buf.started(gid, 0)
            buf.add(g)
            gid += 1
        elif op == "take" and (batch := buf.take(0)) is not None:
            if rng.random() < 0.5:
                buf.requeue(batch)  # a step undone: its groups are ready again
        elif op == "refuse":
            buf.refuse(rng.randint(0, 3))
        assert buf.ready_tokens == sum(group_tokens(g) for g in buf.ready.values())
        assert buf.ready_samples == sum(len(g) for g in buf.ready.values())


@pytest.mark.timeout(60)
async def test_a_rate_measured_on_short_samples_reads_slower_for_longer_ones() -> None:
    h = Harness(steps=3, assignments=dict(POOLS))
    async with serving(h, dict(POOLS)) as (run, _):
        await asyncio.wait_for(run, 30)
    t = h.ctl.training
    [(size, (tokens, secs))] = t.by_size.items()  # one trainer took every step
    trained = [q for st in h.train_steps for q in st.seqs]
    assert tokens == sum(len(q.prompt_ids) + len(q.response_ids) for q in trained)
    last = h.train_steps[-1].seqs
    per_sample = sum(len(q.prompt_ids) + len(q.response_ids) for q in last) / len(last)
    assert t.last_tokens_per_sample == pytest.approx(per_sample)

    def rate() -> float:
        [(n, r)] = planner_view(h.ctl).pools["trainer"].rate_by_size
        assert n == size
        return r

    # nothing waits: the last step's samples say how long a sample is
    assert rate() == pytest.approx(tokens / secs / per_sample)
    # samples three times as long are waiting: a third of the samples/s, same tokens/s
    long = round(3 * per_sample)
    h.ctl.train_buffer.add(group(10**6, long // 2, long - long // 2))
    assert rate() == pytest.approx(tokens / secs / long)
