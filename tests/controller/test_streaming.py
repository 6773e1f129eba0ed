"""The controller over the in-process transport, with the test playing the workers through the
protocol: per-sample streaming, exactly-once training, staleness, failed judgements."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pivotflow.controller.clock import LoopClock
from pivotflow.controller.core import Controller, ControllerConfig
from pivotflow.controller.source import PromptSource
from pivotflow.errors import GraphError
from pivotflow.graph import Graph
from pivotflow.protocol import (
    PROTOCOL_VERSION,
    AssignRole,
    Hello,
    JobDone,
    Jobs,
    JobsDone,
    RoleReady,
    TrainDone,
    TrainStep,
    Welcome,
)
from pivotflow.rl.group_fns import grpo_advantage
from pivotflow.run_models import ProblemStream
from pivotflow.tasks.tokenizer import default_tokenizer
from pivotflow.transport.local import LocalHub

TOK = default_tokenizer()


def template(prompt: str, response: str, **_: Any) -> str:
    return prompt + response + "?"


def parse(verdict: str, **_: Any) -> float | None:
    return {"Y": 1.0, "N": 0.0}.get(verdict)


def make_graph(group_size: int = 2, groups_per_step: int = 2, keep: Any = None) -> Graph:
    g = Graph("t")
    g.model("policy", source="unused")
    g.model("judge", source="unused")
    g.pool("rollout", workers=1)
    g.pool("genrm", workers=1)
    g.pool("trainer", workers=1)
    src = g.source("prompts", task="arithmetic", group_size=group_size,
                   groups_per_step=groups_per_step)
    gen = g.generate("rollout", model="policy", pool="rollout", max_tokens=4)
    jud = g.judge("genrm", model="judge", pool="genrm", template=template, parse=parse)
    adv = g.group("advantage", grpo_advantage, writes=["advantage"])
    tr = g.train("train", model="policy", pool="trainer")
    if keep is None:
        g.chain(src, gen, jud, adv, tr)
    else:
        g.chain(src, gen, jud, g.filter("keep", keep), adv, tr)
    return g


class Harness:
    """A controller on a LocalHub; ``self.ends`` are the worker ends the test speaks through."""

    def __init__(self, steps: int, max_staleness: int = 0, **graph_kw: Any) -> None:
        self.graph = make_graph(**graph_kw)
        self.records: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self.hub = LocalHub()
        assignments = {"w-roll": "rollout", "w-judge": "genrm", "w-train": "trainer"}
        source = PromptSource(self.graph.order()[0],
                              ProblemStream(self.graph.order()[0], seed=0), TOK, steps=steps,
                              max_staleness=max_staleness, seed=0)
        self.ctl = Controller(self.graph, ControllerConfig(steps=steps,
                                                           max_staleness=max_staleness),
                              transport=self.hub.controller, clock=LoopClock(),
                              tokenizers={"policy": TOK, "judge": TOK}, source=source,
                              assignments=assignments, role_options={}, store_dir="/unused",
                              on_step=self.records.append)
        self.ends = {w: self.hub.connect(w) for w in assignments}

    async def join_all(self) -> None:
        for wid, end in self.ends.items():
            end.send(Hello(protocol_version=PROTOCOL_VERSION, worker_id=wid, pid=1))
            assert isinstance(await end.recv(), Welcome)
            role = await end.recv()
            assert isinstance(role, AssignRole)
            end.send(RoleReady(role=role.role, model=role.model, version=0))

    async def jobs(self, wid: str) -> list[Any]:
        msg = await asyncio.wait_for(self.ends[wid].recv(), 5)
        assert isinstance(msg, Jobs), msg
        return list(msg.jobs)


def done(job_id: int, text: str, version: int = 0) -> JobDone:
    ids = TOK.encode(text) + [TOK.eos_id]
    return JobDone(job_id=job_id, token_ids=ids, logprobs=[-0.5] * len(ids),
                   versions=[version] * len(ids), finish_reason="stop")


async def test_fast_sample_overtakes_slow_one() -> None:
    h = Harness(steps=1, group_size=2, groups_per_step=1)
    run = asyncio.ensure_future(h.ctl.run())
    await h.join_all()
    first, second = await h.jobs("w-roll")
    # The second sample finishes first: it must reach the judge while the first still runs.
    h.ends["w-roll"].send(JobsDone(results=[done(second.job_id, "12")]))
    (judged,) = await h.jobs("w-judge")
    sample = h.ctl.jobs[judged.job_id][0]
    assert sample.fields["response"] == "12"
    assert first.job_id in h.ctl.jobs  # the slow one is still in flight
    h.ends["w-roll"].send(JobsDone(results=[done(first.job_id, "99")]))
    (judged2,) = await h.jobs("w-judge")
    h.ends["w-judge"].send(JobsDone(results=[done(judged.job_id, "Y"), done(judged2.job_id, "N")]))
    step = await asyncio.wait_for(h.ends["w-train"].recv(), 5)
    assert isinstance(step, TrainStep) and len(step.seqs) == 2
    advs = sorted(s.advantage for s in step.seqs)
    assert advs[0] < 0 < advs[1]
    h.ends["w-train"].send(TrainDone(step=0, version=1, stats={}, job_ids=[]))
    await asyncio.wait_for(run, 5)
    assert h.ctl.ledger.groups_trained == 1 and h.ctl.lost_groups() == []


async def drive(h: Harness, *, judge_text: str = "Y", late_copy: bool = False,
                raises: type[BaseException] | None = None) -> list[TrainStep]:
    """Play all three workers until the run ends; return the train steps seen."""
    steps: list[TrainStep] = []
    run = asyncio.ensure_future(h.ctl.run())
    await h.join_all()

    async def serve(wid: str, answer: Any) -> None:
        end = h.ends[wid]
        while True:
            msg = await end.recv()
            if isinstance(msg, Jobs):
                results = [answer(j) for j in msg.jobs]
                end.send(JobsDone(results=results))
                if late_copy:  # a result delivered twice is applied once
                    end.send(JobsDone(results=results))
            elif isinstance(msg, TrainStep):
                steps.append(msg)
                end.send(TrainDone(step=msg.step, version=msg.step + 1, stats={},
                                   job_ids=[s.job_id for s in msg.seqs]))

    rollout_n = iter(range(10**6))
    servers = [
        asyncio.ensure_future(serve("w-roll", lambda j: done(
            j.job_id, str(next(rollout_n) % 3), version=j.min_version))),
        asyncio.ensure_future(serve("w-judge", lambda j: done(j.job_id, judge_text))),
        asyncio.ensure_future(serve("w-train", None)),
    ]
    try:
        if raises is None:
            await asyncio.wait_for(run, 10)
        else:
            with pytest.raises(raises) as info:
                await asyncio.wait_for(run, 10)
            h.error = info.value
    finally:
        for s in servers:
            s.cancel()
        await asyncio.gather(*servers, return_exceptions=True)
    return steps


@pytest.mark.parametrize("staleness", [0, 2])
async def test_every_group_trained_exactly_once(staleness: int) -> None:
    h = Harness(steps=5, max_staleness=staleness, group_size=3, groups_per_step=4)
    steps = await drive(h, late_copy=True)
    trained = [s.job_id // 3 for step in steps for s in step.seqs]  # sample id -> group id
    groups = sorted(set(trained))
    assert groups == list(range(20))
    assert all(trained.count(g) == 3 for g in groups)  # each group once, whole
    assert h.ctl.ledger.duplicates == 0 and h.ctl.lost_groups() == []
    assert h.ctl.ledger.late_results > 0  # the second copies were seen and dropped
    assert [r["step"] for r in h.records] == [1, 2, 3, 4, 5]
    # staleness: a token trained at step t was generated by version >= t - max_staleness
    for step in steps:
        assert all(step.step - min(s.versions) <= staleness for s in step.seqs)


async def test_unparseable_verdicts_are_counted_not_zero() -> None:
    h = Harness(steps=1, group_size=2, groups_per_step=2)
    steps = await drive(h, judge_text="maybe")
    assert h.ctl.ledger.judge_failures == 4
    assert all(s.advantage == 0.0 for s in steps[0].seqs)
    assert h.records[0]["reward_mean"] is None


async def test_filter_drops_refill_and_a_filter_that_drops_everything_fails_clearly() -> None:
    kept = iter([False, True] * 100)
    h = Harness(steps=2, group_size=2, groups_per_step=2, keep=lambda reward, **_: next(kept))
    steps = await drive(h)
    assert h.ctl.ledger.groups_filtered == 4 and h.ctl.ledger.groups_trained == 4
    assert h.ctl.ledger.prompts_in == 8 and h.ctl.lost_groups() == []
    assert len(steps) == 2

    h = Harness(steps=2, group_size=2, groups_per_step=2, keep=lambda reward, **_: False)
    await drive(h, raises=GraphError)
    assert "filter 'keep'" in str(h.error) and "nothing is left to train on" in str(h.error)
