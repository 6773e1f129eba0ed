"""A controller on the in-process transport, with the test playing the workers through the
protocol (the tests drive the real controller; nothing of it is replaced)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pivotflow.controller.clock import LoopClock
from pivotflow.controller.core import Controller, ControllerConfig
from pivotflow.controller.source import PromptSource
from pivotflow.graph import Graph
from pivotflow.protocol import (
    PROTOCOL_VERSION,
    AbortJobs,
    AssignRole,
    Heartbeat,
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
from pivotflow.tokenizer import default_tokenizer
from pivotflow.transport.local import LocalHub

TOK = default_tokenizer()


def template(prompt: str, response: str, **_: Any) -> str:
    return prompt + response + "?"


def parse(verdict: str, **_: Any) -> float | None:
    return {"Y": 1.0, "N": 0.0}.get(verdict)


def make_graph(group_size: int = 2, groups_per_step: int = 2, keep: Any = None,
               judge_template: Any = template, **generate: Any) -> Graph:
    """prompts -> rollout -> genrm -> [keep] -> advantage -> train; ``generate`` options
    (e.g. ``tools=``) replace the rollout's defaults."""
    g = Graph("t")
    g.model("policy", source="unused")
    g.model("judge", source="unused")
    g.pool("rollout", workers=1)
    g.pool("genrm", workers=1)
    g.pool("trainer", workers=1)
    src = g.source("prompts", task="arithmetic", group_size=group_size,
                   groups_per_step=groups_per_step)
    gen = g.generate("rollout", model="policy", pool="rollout", **{"max_tokens": 4, **generate})
    jud = g.judge("genrm", model="judge", pool="genrm", template=judge_template, parse=parse)
    adv = g.group("advantage", grpo_advantage, writes=["advantage"])
    tr = g.train("train", model="policy", pool="trainer")
    if keep is None:
        g.chain(src, gen, jud, adv, tr)
    else:
        g.chain(src, gen, jud, g.filter("keep", keep), adv, tr)
    return g


class Harness:
    """A controller on a LocalHub; ``self.ends`` are the worker ends the test speaks through."""

    def __init__(self, steps: int, max_staleness: int = 0,
                 assignments: dict[str, str] | None = None, planner: Any = None,
                 respawn: Any = None, worker_timeout_s: float = 30.0,
                 graph: Graph | None = None, tool_pools: dict[str, Any] | None = None,
                 tok: Any = TOK, **graph_kw: Any) -> None:
        """``tok``: the policy's and the judge's tokenizer (the char one unless given)."""
        self.graph = graph or make_graph(**graph_kw)
        self.expect = expected_tokens  # what TokenWorkers generate for a prompt
        self.records: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self.train_steps: list[TrainStep] = []
        self.hub = LocalHub()
        assignments = assignments or {"w-roll": "rollout", "w-judge": "genrm",
                                      "w-train": "trainer"}
        source = PromptSource(self.graph.order()[0],
                              ProblemStream(self.graph.order()[0], seed=0), tok, steps=steps,
                              max_staleness=max_staleness, seed=0)
        cfg = ControllerConfig(steps=steps, max_staleness=max_staleness, heartbeat_s=0.05,
                               worker_timeout_s=worker_timeout_s)
        self.ctl = Controller(self.graph, cfg,
                              transport=self.hub.controller, clock=LoopClock(),
                              tokenizers={"policy": tok, "judge": tok}, source=source,
                              assignments=assignments, role_options={}, store_dir="/unused",
                              on_step=self.records.append, planner=planner, respawn=respawn,
                              tool_pools=tool_pools)
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




def expected_tokens(prompt_ids: list[int], model: str) -> list[int]:
    """What TokenWorker generates for a prompt: a pure function of (prompt, position), like the
    engine's seeded sampling, so a migrated sequence must end exactly the same."""
    if model == "judge":
        return TOK.encode("Y" if sum(prompt_ids) % 2 else "N") + [TOK.eos_id]
    n = 4 + sum(prompt_ids) % 5
    return [TOK.encode(str((sum(prompt_ids) + i) % 10))[0] for i in range(n)] + [TOK.eos_id]


class TokenWorker:
    """A protocol-speaking worker that makes one token per job per tick, so jobs stay in flight
    long enough to be aborted; it honours AbortJobs (partial state) and AssignRole (new role)."""

    def __init__(self, h: Harness, wid: str, tick_s: float = 0.003) -> None:
        self.h, self.wid, self.tick_s = h, wid, tick_s
        self.end = h.ends[wid]
        self.model = ""
        self.version = 0
        self.jobs: dict[int, tuple[Any, list[int], list[float], list[int]]] = {}
        self.roles: list[str] = []
        self.policy_tokens = 0  # tokens this worker sampled for the policy (never twice)
        self.paused = False  # like SIGSTOP: neither works nor heartbeats
        self._last_beat = 0.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.paused:
                await asyncio.sleep(self.tick_s)
                continue
            if loop.time() - self._last_beat > 0.02:
                self.end.send(Heartbeat(worker_id=self.wid))
                self._last_beat = loop.time()
            # get_nowait + sleep, not wait_for(recv): a timed-out wait_for can drop a message.
            try:
                msg = self.end.inbox.get_nowait()
            except asyncio.QueueEmpty:
                msg = None
                await asyncio.sleep(self.tick_s)
            if isinstance(msg, AssignRole):
                if self.jobs:
                    raise RuntimeError("the controller changed the role before aborting jobs")
                self.model = msg.model
                self.roles.append(msg.model)
                self.end.send(RoleReady(role=msg.role, model=msg.model, version=self.version,
                                        load_s=0.01, release_s=0.001))
            elif isinstance(msg, Jobs):
                for j in msg.jobs:
                    self.version = max(self.version, j.min_version)
                    self.jobs[j.job_id] = (j, list(j.prefix_ids), list(j.prefix_logprobs),
                                           list(j.prefix_versions))
            elif isinstance(msg, AbortJobs):
                ids = list(msg.job_ids) or list(self.jobs)
                out = [JobDone(job_id=i, token_ids=t, logprobs=lp, versions=v,
                               finish_reason="abort")
                       for i in ids if i in self.jobs
                       for (_, t, lp, v) in [self.jobs.pop(i)]]
                self.end.send(JobsDone(results=out))
            elif isinstance(msg, TrainStep):
                self.h.train_steps.append(msg)
                self.end.send(TrainDone(step=msg.step, version=msg.step + 1, stats={},
                                        job_ids=[], rank=msg.rank))
            self._tick()

    def _tick(self) -> None:
        finished = []
        for job_id, (job, toks, lps, vers) in list(self.jobs.items()):
            want = self.h.expect(list(job.prompt_ids), self.model)
            toks.append(want[len(toks)])
            self.policy_tokens += self.model == "policy"
            lps.append(-0.1 * len(toks))
            vers.append(self.version)
            if len(toks) == len(want):
                finished.append(JobDone(job_id=job_id, token_ids=toks, logprobs=lps,
                                        versions=vers, finish_reason="stop"))
                del self.jobs[job_id]
        if finished:
            self.end.send(JobsDone(results=finished))


async def start_workers(h: Harness, pools: dict[str, str],
                        ticks: dict[str, float] | None = None) -> list[TokenWorker]:
    """TokenWorkers for ``pools``, each through the handshake and ready in its role."""
    workers = [TokenWorker(h, w, **({"tick_s": ticks[w]} if ticks and w in ticks else {}))
               for w in pools]
    for w in workers:  # handshake by hand, then the TokenWorker serves the role
        w.end.send(Hello(protocol_version=PROTOCOL_VERSION, worker_id=w.wid, pid=1))
        assert isinstance(await w.end.recv(), Welcome)
        role = await w.end.recv()
        assert isinstance(role, AssignRole)
        w.model = role.model
        w.end.send(RoleReady(role=role.role, model=role.model, version=0))
    return workers


@contextlib.asynccontextmanager
async def serving(h: Harness, pools: dict[str, str], ticks: dict[str, float] | None = None
                  ) -> AsyncIterator[tuple[asyncio.Future[None], list[TokenWorker]]]:
    """The controller running with TokenWorkers for ``pools``: yields (run, workers); the
    workers stop on exit, however the block ends."""
    run = asyncio.ensure_future(h.ctl.run())
    workers = await start_workers(h, pools, ticks)
    tasks = [asyncio.ensure_future(w.run()) for w in workers]
    try:
        yield run, workers
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
