"""A simulated cluster: the real controller, pools and planner on the in-process transport, in
virtual time, with one ``SimWorker`` per GPU group.

``simulate(workload, planner, split)`` builds the GenRM graph for the workload (source ->
rollout -> genrm -> advantage -> train, the shape of ``graphs/grpo_genrm.py``), starts the
controller and the workers on a ``VirtualTimeLoop`` and runs to the workload's steps or a
virtual-time horizon. Nothing of the controller is replaced: only workers and time are
simulated.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from pivotflow.assembly import ControllerParts, assemble
from pivotflow.controller.core import Controller, ControllerConfig
from pivotflow.controller.recovery import Respawn
from pivotflow.controller.source import PromptSource
from pivotflow.errors import ConfigError
from pivotflow.graph import Graph
from pivotflow.planner import make_planner
from pivotflow.planner.base import Planner, StaticPlanner
from pivotflow.rl.group_fns import grpo_advantage
from pivotflow.sim.cores import CoreShare
from pivotflow.sim.cost_model import CostModel
from pivotflow.sim.sim_worker import SimWorker
from pivotflow.sim.tokens import FILLER, SimProblems, SimTokenizer
from pivotflow.sim.virtual_clock import SimClock, run_virtual
from pivotflow.sim.workload import Workload
from pivotflow.tasks.judge_format import parse_verdict
from pivotflow.tasks.length_budget import length_budget
from pivotflow.transport.local import LocalHub

POOLS = ("rollout", "genrm", "trainer")


@dataclass(slots=True)
class Split:
    """Workers (GPU groups) per pool."""

    rollout: int
    genrm: int
    trainer: int

    def as_dict(self) -> dict[str, int]:
        return {"rollout": self.rollout, "genrm": self.genrm, "trainer": self.trainer}

    @property
    def total(self) -> int:
        return self.rollout + self.genrm + self.trainer

    @classmethod
    def colocated(cls, workers: int) -> Split:
        """How the benches start the colocated planner: every worker in the rollout pool but one
        for each other pool (each pool needs a worker to start)."""
        return cls(rollout=workers - 2, genrm=1, trainer=1)


@dataclass(slots=True)
class SimResult:
    """One simulated run: throughput, the controller's step records, pools over time."""

    workload: str
    planner: str
    gpus: int
    split: dict[str, int]
    steps: int
    samples: int
    sim_s: float  # virtual seconds until the last optimizer step
    wall_s: float
    samples_per_s: float  # steady state: without the first and last step (from 4 steps)
    tokens_generated: int
    shifts: list[dict[str, Any]]
    records: list[dict[str, Any]] = field(repr=False)
    pool_trace: list[tuple[float, dict[str, int]]] = field(repr=False)
    busy_share: dict[str, float] = field(default_factory=dict)  # role -> share of GPU time
    timed_out: bool = False
    decisions: int = 0
    # the controller's decision log (every move with its numbers; a re-size's carry resize=1)
    decision_log: list[dict[str, Any]] = field(default_factory=list, repr=False)
    planner_log: list[dict[str, Any]] = field(default_factory=list, repr=False)  # (adaptive)
    # each trace time's samples waiting on each edge (``pool_trace``'s times): whether work
    # ever waits for a free slot, which an order of dispatch needs to matter
    queue_trace: list[tuple[float, dict[str, int]]] = field(default_factory=list, repr=False)

    def summary(self) -> dict[str, Any]:
        totals = [s["total_s"] for s in self.shifts if s.get("total_s") is not None]
        return {
            "workload": self.workload,
            "planner": self.planner,
            "gpus": self.gpus,
            "split": self.split,
            "steps": self.steps,
            "samples": self.samples,
            "sim_s": round(self.sim_s, 3),
            "wall_s": round(self.wall_s, 3),
            "samples_per_s": round(self.samples_per_s, 4),
            "tokens_generated": self.tokens_generated,
            "shifts": len(self.shifts),
            "shift_s_mean": round(sum(totals) / len(totals), 3) if totals else None,
            "shift_s_max": round(max(totals), 3) if totals else None,
            "busy_share": {k: round(v, 3) for k, v in self.busy_share.items()},
            "timed_out": self.timed_out,
        }


def sim_graph(wl: Workload, split: Split) -> Graph:
    """The GenRM graph of ``graphs/grpo_genrm.py`` sized for ``wl``; the judge reads a
    template of ``template_tokens`` tokens, the prompt and the whole response."""
    rubric = FILLER * wl.template_tokens

    def template(prompt: str, response: str, **_: object) -> str:
        return rubric + prompt + response

    def parse(verdict: str, **_: object) -> float | None:
        return parse_verdict(verdict)

    g = Graph(f"sim-{wl.name}")
    g.model("policy", source="sim:policy")
    g.model("judge", source="sim:judge")
    for pool, n in split.as_dict().items():
        g.pool(pool, workers=n)
    src = g.source(
        "prompts", task="sim", group_size=wl.group_size, groups_per_step=wl.prompts_per_step
    )
    stages = [src]
    if wl.response.draw == "budget":  # lengths per sample id, as the real graph draws them
        r = wl.response
        budget = length_budget(r.median, r.p99_over_median, r.cap, wl.schedule,
                               wl.prompts_per_step)
        stages.append(g.map("budget", budget, writes=["min_tokens", "max_tokens"]))
    # (a drifting workload's longest cap: the simulated engine cuts each at its step's cap)
    gen = g.generate("rollout", model="policy", pool="rollout", max_tokens=wl.max_response_cap)
    jud = g.judge(
        "genrm",
        model="judge",
        pool="genrm",
        template=template,
        parse=parse,
        max_tokens=wl.max_verdict_tokens,
    )
    adv = g.group("advantage", grpo_advantage, writes=["advantage"])
    tr = g.train("train", model="policy", pool="trainer")
    g.chain(*stages, gen, jud, adv, tr)
    return g


def role_options(wl: Workload, cost: CostModel) -> dict[str, dict[str, Any]]:
    """Per pool, the batch a worker holds: replicas x sequences whose KV fits in memory."""
    g = wl.group_gpus
    p, r = cost.mean_prompt(), cost.mean_response()
    roll = cost.replicas(wl.policy, g) * cost.max_seqs(wl.policy, p + r)
    jctx = cost.judge_prompt_tokens(p, r) + wl.verdict_tokens
    judge = cost.replicas(wl.judge, g) * cost.max_seqs(wl.judge, jctx)
    return {"rollout": {"max_batch": roll}, "genrm": {"max_batch": judge}, "trainer": {}}


def follow_lengths(ctl: Controller, wl: Workload) -> None:
    """A drifting workload's engines hold the batch its current lengths fit in memory: after
    each optimizer step the batch each generate worker holds (the controller's job slots, as
    its engine's KV budget bounds them) is that of the new policy version's lengths."""
    opts = role_options(wl.at(ctl.version), CostModel(wl.at(ctl.version)))
    for name in ctl.pools:
        batch = opts.get(name, {}).get("max_batch")
        if batch is None:
            continue
        ctl.set_max_batch(name, batch)


class _Horizon(Exception):
    """The simulated run reached its virtual-time horizon or its wall-clock limit."""


class SimFleet:
    """Simulated workers as the run's fleet (``assembly.Fleet``): each says Hello when its
    loop starts and serves on the virtual clock; a dead one is not replaced."""

    respawn: Respawn | None = None

    def __init__(self, workers: list[SimWorker]) -> None:
        self.workers = workers

    def bind(self, ctl: Controller) -> None:
        pass  # one store for every worker, and no placement to tell

    def start(self) -> None:
        pass  # a simulated worker starts with its loop (serving)

    def serving(self) -> list[Coroutine[Any, Any, None]]:
        return [w.run() for w in self.workers]

    def close(self) -> None:
        pass  # their loops end with the run's task group; each closes its end


def _planner(name: str | Planner) -> Planner:
    return make_planner(name) if isinstance(name, str) else name


async def _simulate(
    wl: Workload,
    planner: Planner,
    split: Split,
    steps: int,
    horizon_s: float,
    wall_limit_s: float,
    seed: int,
    trace_every_s: float,
    controller: dict[str, Any],
) -> SimResult:
    loop = asyncio.get_running_loop()
    cost = CostModel(wl)
    tok = SimTokenizer(compact=True)
    graph = sim_graph(wl, split)
    hub = LocalHub(codec=False)  # the same objects, without msgpack round trips
    assignments = {
        f"w{i:04d}": pool
        for i, pool in enumerate(p for p, n in split.as_dict().items() for _ in range(n))
    }
    source = PromptSource(
        graph.order()[0],
        SimProblems(wl.prompt.median, wl.prompt.sigma, wl.prompt.cap, seed),
        tok,
        steps=steps,
        max_staleness=wl.max_staleness,
        seed=seed,
    )
    records: list[dict[str, Any]] = []

    def on_step(rec: dict[str, Any]) -> None:
        records.append(rec)
        if wl.schedule is not None:
            follow_lengths(ctl, wl)
            cost.policy_version = ctl.version

    cfg = ControllerConfig(
        steps=steps, max_staleness=wl.max_staleness, heartbeat_s=30.0, worker_timeout_s=600.0,
        **controller,  # (partial_rollout, over_sample, warm_roles: pivotflow sim --set)
    )
    parts = ControllerParts(
        tokenizers={"policy": tok, "judge": tok},
        source=source,
        assignments=assignments,
        role_options=role_options(wl.at(0), CostModel(wl.at(0))),
        store_dir="/nonexistent/pivotflow-sim",
        planner=planner,
        on_step=on_step,
    )
    cores = CoreShare(wl.hardware.cores) if wl.hardware.cores else None
    fleet = SimFleet([SimWorker(hub.connect(w), cost, wl.group_gpus, tok, cores=cores)
                      for w in assignments])
    trace: list[tuple[float, dict[str, int]]] = []
    queues: list[tuple[float, dict[str, int]]] = []
    wall0 = time.perf_counter()
    t_start = loop.time()

    async def watch() -> None:
        """Trace the pools' sizes; end the run at the virtual horizon or the wall limit."""
        while True:
            now = loop.time() - t_start
            trace.append((now, {n: len(p.workers) for n, p in ctl.pools.items()}))
            queues.append((now, {e.name: len(e) for e in ctl.edges.values()}))
            await asyncio.sleep(trace_every_s)
            if loop.time() - t_start > horizon_s or time.perf_counter() - wall0 > wall_limit_s:
                raise _Horizon

    timed_out = False
    with contextlib.ExitStack() as stack:
        machine = assemble(stack, graph, cfg, parts, transport=hub.controller,
                           clock=SimClock(loop), fleet=fleet)
        ctl = machine.controller
        try:
            # a controller error (a worker failed, a stage raised) surfaces here
            await machine.run(watch())
        except _Horizon:
            timed_out = True
    workers = fleet.workers
    wall = time.perf_counter() - wall0
    samples = sum(r["samples"] for r in records)
    end = records[-1]["time_s"] if records else loop.time() - t_start
    if len(records) >= 4:  # drop the pipeline's fill (first step) and drain (last step)
        steady = sum(r["samples"] for r in records[1:-1]) / (
            records[-2]["time_s"] - records[0]["time_s"]
        )
    else:
        steady = samples / end if end > 0 else 0.0
    busy: dict[str, float] = {}
    for w in workers:
        for key, secs in w.busy_by_role().items():
            busy[key] = busy.get(key, 0.0) + secs
    busy = {k: v / (max(end, 1e-9) * len(workers)) for k, v in busy.items()}
    shifts = [e for r in records for e in r.get("shift_events", [])]
    return SimResult(
        wl.name,
        planner.name,
        wl.gpus,
        split.as_dict(),
        len(records),
        samples,
        end,
        wall,
        steady,
        ctl.tokens_generated,
        shifts,
        records,
        trace,
        busy,
        timed_out,
        len(ctl.decisions),
        list(ctl.decisions),
        list(getattr(planner, "log", [])),
        queues,
    )


def simulate(
    wl: Workload,
    planner: str | Planner,
    split: Split,
    *,
    steps: int | None = None,
    horizon_s: float = 36000.0,
    wall_limit_s: float = 600.0,
    seed: int = 0,
    trace_every_s: float = 10.0,
    controller: dict[str, Any] | None = None,
) -> SimResult:
    """Run ``wl`` on its GPUs split as ``split`` under ``planner`` for ``steps`` optimizer
    steps (the workload's by default), stopping early at ``horizon_s`` virtual or
    ``wall_limit_s`` wall seconds. A pool may start empty under a planner that moves workers;
    a static one needs a worker in each pool, or in each of its colocate groups. Raises
    ConfigError for a split that does not fit the cluster, and the controller's error if the
    run fails."""
    chosen = _planner(planner)
    sizes = split.as_dict()
    if wl.schedule is not None and wl.schedule.varies("prompts_per_step"):
        raise ConfigError(
            f"{wl.path}: [schedule] prompts_per_step varies, but the controller's source admits "
            "a fixed groups_per_step: the simulator cannot run it yet"
        )
    if split.total * wl.group_gpus != wl.gpus:
        raise ConfigError(
            f"split {sizes} x {wl.group_gpus} GPUs does not fill {wl.gpus} GPUs"
        )
    if isinstance(chosen, StaticPlanner):
        parts: list[tuple[str, ...]] = [(p,) for p in POOLS]
    else:  # a static partition's groups (ColocatedPlanner.groups); moving planners: the whole
        parts = list(getattr(chosen, "groups", ())) or [POOLS]
    empty = [g for g in parts if sum(sizes[p] for p in g) < 1]
    if empty:
        raise ConfigError(
            f"split {sizes} under planner {chosen.name!r} leaves {'+'.join(empty[0])} without "
            "a worker (a static planner needs one in every pool or colocate group)"
        )
    # The run allocates millions of small objects and frees them by reference count; the
    # cyclic collector found next to nothing to free yet took a third of the time.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return run_virtual(
            _simulate(
                wl,
                chosen,
                split,
                steps or wl.steps,
                horizon_s,
                wall_limit_s,
                seed,
                trace_every_s,
                controller or {},
            )
        )
    finally:
        if was_enabled:
            gc.enable()
