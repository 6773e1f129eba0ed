"""The controller: one asyncio task that streams samples through the graph's stages.

It owns the edges, the pools, the ledger and the transport's handlers (``handlers.py``: what
each message does); it does no model math. Every event (a result, a finished train step, a
worker joining) runs to completion on the loop and then ``pump`` moves whatever can move:
admit prompts, dispatch ready samples, start a train step. Time comes from the injected
clock, messages from the injected transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pivotflow import defaults
from pivotflow.controller import stages, user_code, user_metrics
from pivotflow.controller.async_calls import AsyncCalls
from pivotflow.controller.barriers import Barriers
from pivotflow.controller.checkpoint_collector import CheckpointCollector
from pivotflow.controller.clock import Clock
from pivotflow.controller.edges import Edge
from pivotflow.controller.evaluation import Evaluation
from pivotflow.controller.handlers import Handlers
from pivotflow.controller.jobs import JobTable
from pivotflow.controller.partial import PartialRollouts
from pivotflow.controller.planning import planner_view
from pivotflow.controller.pools import Pool, Roster, WorkerHandle
from pivotflow.controller.records import lost_groups, step_record
from pivotflow.controller.recovery import Recovery, Respawn
from pivotflow.controller.sample import Ledger, Sample, held_out
from pivotflow.controller.shifts import ShiftManager
from pivotflow.controller.source import PromptSource
from pivotflow.controller.stages import SERVED
from pivotflow.controller.tool_calls import ToolCalls
from pivotflow.controller.train_batch import FIRST, TrainBuffer
from pivotflow.controller.training import TrainSteps
from pivotflow.controller.user_metrics import UserMetrics
from pivotflow.errors import GraphError, WorkerError
from pivotflow.graph import TEXT_FIELDS, Graph
from pivotflow.planner.base import Planner, PlannerView, StaticPlanner
from pivotflow.protocol import AssignRole, Jobs, Shutdown, ToWorker, TrainDone
from pivotflow.tokenizer.base import Tokenizer
from pivotflow.tools.pool import ToolPool
from pivotflow.transport.base import ControllerTransport

log = logging.getLogger("pivotflow.controller")

class _RunOver(Exception):
    """Raised in the run's task group once the run is over, to cancel its loops."""


BARRIERS = ("group", "filter", "train")  # stages that wait for a whole group
# a pool's worker role; others "generate" (a reward model's pool scores, as a reference's)
ROLE_OF = {"train": "train", "reference": "score", "reward_model": "score", "critic": "score"}


@dataclass(slots=True)
class ControllerConfig:
    # defaults shared with RunConfig come from pivotflow.defaults (one copy; they had drifted)
    steps: int = defaults.STEPS
    max_staleness: int = defaults.MAX_STALENESS
    heartbeat_s: float = defaults.HEARTBEAT_S
    worker_timeout_s: float = defaults.WORKER_TIMEOUT_S
    max_jobs_per_frame: int = defaults.MAX_JOBS_PER_FRAME
    max_filtered_per_step: int = 10  # x groups_per_step filtered in a row fails the run
    max_worker_restarts: int = defaults.MAX_WORKER_RESTARTS
    # partial rollouts (off until their RL effect is measured): see controller/partial.py
    partial_rollout: bool = defaults.PARTIAL_ROLLOUT
    over_sample: float = defaults.OVER_SAMPLE  # partial only: extra groups, x groups_per_step
    warm_roles: bool = defaults.WARM_ROLES  # workers keep the roles they leave (worker/host.py)


class Controller:
    """Runs one graph to ``steps`` optimizer steps on the workers that connect to it."""

    def __init__(self, graph: Graph, cfg: ControllerConfig, *, transport: ControllerTransport,
                 clock: Clock, tokenizers: dict[str, Tokenizer], source: PromptSource,
                 assignments: dict[str, str], role_options: dict[str, dict[str, Any]],
                 store_dir: str, on_step: Callable[[dict[str, Any]], None] | None = None,
                 planner: Planner | None = None, respawn: Respawn | None = None,
                 tool_pools: dict[str, ToolPool] | None = None,
                 on_samples: Callable[[list[list[Sample]], int, int], None] | None = None,
                 evaluation: Evaluation | None = None) -> None:
        self.graph, self.cfg, self.transport, self.clock = graph, cfg, transport, clock
        self.order = graph.order()
        self.tok = tokenizers
        self.source = source
        self.evaluation = evaluation  # held-out rounds (eval_every), None when off
        self.store_dir = store_dir
        # a launcher with a store copy per node names each worker's (launch/workers.attach)
        self.store_dir_for: Callable[[str], str] = lambda _worker: store_dir
        self.role_options = role_options
        self.on_step = on_step
        # samples.jsonl: each step's trained samples themselves (batch, step, version)
        self.on_samples = on_samples
        self.pools = {p.name: Pool(p.name, "", "") for p in graph.pools.values()}
        for node in self.order:
            if node.pool:
                pool = self.pools[node.pool]
                pool.role = ROLE_OF.get(node.kind, "generate")
                pool.model = graph.weights_of(node)
        self.roster = Roster(self.pools, assignments)  # the one writer of pool membership
        self.workers = self.roster.workers  # (read by every part; changed by the roster)
        self.edges = {i: Edge(f"{self.order[i - 1].name}->{n.name}")
                      for i, n in enumerate(self.order) if n.kind in SERVED}
        self.barriers = Barriers(i for i, n in enumerate(self.order) if n.kind in BARRIERS)
        self.train_buffer = TrainBuffer(source.groups_per_step, cfg.max_staleness,
                                        partial=cfg.partial_rollout,
                                        skip_tail=cfg.over_sample > 0)
        self.partial = PartialRollouts(self) if cfg.partial_rollout else None
        if self.partial is not None:
            source.extra = self.partial.extra_groups(cfg.over_sample)
        self.ledger = Ledger()
        self.user_metrics = UserMetrics(cfg.steps)  # what the graph's own code logs (log_metric)
        self.jobs = JobTable({i: self.order[i].pool or "" for i in self.edges}, self.pools)
        # a snapshot's wait for the generations in flight (checkpoint_collector.py)
        self.collector = CheckpointCollector(self.jobs, self.send)
        self.version = 0
        self.training = TrainSteps(self, self.order[-1].pool or "", store_dir)
        self.tokens_generated = 0
        self.shifts = ShiftManager(self)
        self.recovery = Recovery(self, respawn, cfg.max_worker_restarts)
        self.planner: Planner = planner or StaticPlanner()
        self.decisions: list[dict[str, Any]] = []
        self.filtered_since_step = 0
        self.errors = {"generation": 0}
        self.tools = ToolCalls(self, tool_pools)  # multi-turn stages' calls
        self.calls = AsyncCalls(self)  # async def stage functions' calls
        # decoded for each rollout only where a stage names them (graph.TEXT_FIELDS)
        self.wants_texts = any(TEXT_FIELDS & n.reads for n in self.order)
        self.handlers = Handlers(self)  # the transport's callbacks: what each message does
        self.started_at = 0.0
        self._done: asyncio.Event | None = None
        self._error: BaseException | None = None

    # ------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Serve until ``steps`` train steps are done; raises the first fatal error.

        The heartbeat watch and the planner run in a task group beside the wait: an error in
        either (a planner that raised, a move it cannot make) ends the group and stops the run
        with it, rather than ending that loop unseen (the run would wait forever for steps
        nobody plans)."""
        self._done = asyncio.Event()
        self.started_at = self.clock.now()
        for w in self.workers.values():
            w.heard(self.started_at)
        self.transport.start(self.handlers.on_message, self.handlers.on_flush)
        try:
            # stage functions run inline on this loop's thread: their log_metric calls land here
            with user_metrics.recording(self.user_metrics):
                async with asyncio.TaskGroup() as loops:
                    self.tools.run_in(loops)  # tool calls are tasks of this group
                    self.calls.run_in(loops)  # ... and async stage functions' calls
                    self.tools.resume()  # samples a snapshot had waiting on a call: call again
                    self.calls.resume()
                    loops.create_task(self._tick_forever(), name="heartbeat watch")
                    loops.create_task(self._plan_forever(), name="planner")
                    await self._done.wait()
                    raise _RunOver  # leaves the group: its loops are cancelled
        except* _RunOver:
            pass
        except* Exception as failed:
            log.error("controller loop failed", exc_info=failed.exceptions[0])
            self.fail(failed.exceptions[0])
        finally:
            self.tools.run_in(None)
            self.calls.run_in(None)
            self._shutdown_workers()
        if self._error is not None:
            raise self._error

    def fail(self, error: BaseException) -> None:
        """Stop the run with ``error`` (a worker died, a stage function raised ...)."""
        if self._error is None:
            self._error = error
        if self._done is not None:
            self._done.set()

    def send(self, worker_id: str, msg: ToWorker) -> bool:
        """Send to a worker; a worker that is gone (its peer disconnected) is handed to
        recovery on the next loop turn, so callers in mid-dispatch keep a consistent state."""
        try:
            self.transport.send(worker_id, msg)
            return True
        except WorkerError as exc:
            w = self.workers.get(worker_id)
            if w is not None and w.state not in ("dead", "lost"):
                w.mark_lost()  # takes no more work meanwhile
                asyncio.get_running_loop().call_soon(self.worker_died, worker_id, str(exc))
            return False

    def _shutdown_workers(self) -> None:
        for w in self.workers.values():
            if w.state != "dead":
                with contextlib.suppress(WorkerError):
                    self.transport.send(w.worker_id, Shutdown(reason="run finished"))

    async def _tick_forever(self) -> None:
        while True:
            await self.clock.sleep(self.cfg.heartbeat_s)
            now = self.clock.now()
            for w in list(self.workers.values()):  # a death adds the replacement
                if w.state != "dead" and now - w.last_seen > self.cfg.worker_timeout_s:
                    self.worker_died(w.worker_id, f"no heartbeat for {now - w.last_seen:.1f}s")

    async def _plan_forever(self) -> None:
        while True:
            await self.clock.sleep(self.planner.interval_s)
            self.plan_once()

    def planner_view(self) -> PlannerView:
        """The measurements a planner decides from (see pivotflow.planner.base)."""
        return planner_view(self)

    def plan_once(self, pump: bool = True) -> None:
        """Ask the planner and carry out its moves (each logged with its numbers). Called every
        planner interval, and when a batch is ready (so the trainer pool can grow first)."""
        if self.version >= self.cfg.steps and not self.evaluating:
            return
        for move in self.planner.decide(self.planner_view()):
            rec = self.shifts.shift(move.worker, move.to_pool, reason=move.reason)
            self.decisions.append({"time_s": rec.started_s, "worker": move.worker,
                                   "from": move.from_pool, "to": move.to_pool,
                                   "reason": move.reason, **move.numbers})
            log.info("planner %s: %s %s -> %s (%s)", self.planner.name, move.worker,
                     move.from_pool, move.to_pool, move.reason)
        if pump:
            self.pump()

    def worker_died(self, worker_id: str, reason: str) -> None:
        """A worker is gone (its process exited or it went silent): its work is re-dispatched
        and a new process replaces it (see recovery.py), or the run stops."""
        self.recovery.worker_lost(worker_id, reason)
        self.pump()

    # ------------------------------------------------------------ what the handlers change

    def count_generated(self, tokens: int) -> None:
        """Tokens a generation result added (beyond those of its prefix, counted already)."""
        self.tokens_generated += tokens

    def count_generation_error(self) -> None:
        """A job that came back with an error (``generation_errors`` in summary.json)."""
        self.errors["generation"] += 1

    def count_judge_failure(self) -> None:
        """A judge's verdict that could not be parsed."""
        self.ledger.count_judge_failure()

    def new_policy_version(self, version: int) -> None:
        """An optimizer step finished: the policy is at ``version``, and the count of groups
        dropped since the last step starts again."""
        self.version = version
        self.filtered_since_step = 0

    def finish_if_trained(self) -> None:
        """End the run once its last optimizer step is done (``run`` returns), and its last
        evaluation round, when the run evaluates."""
        if self.version >= self.cfg.steps and not self.evaluating and self._done is not None:
            self._done.set()

    @property
    def evaluating(self) -> bool:
        """An evaluation round is in flight or still to come."""
        return self.evaluation is not None and self.evaluation.busy

    # ------------------------------------------------------------ the flow

    @property
    def inflight(self) -> dict[int, int]:
        """Stage index -> its jobs out at workers (the job table's; read-only here)."""
        return self.jobs.inflight

    def pump(self) -> None:
        """Move whatever can move: admit prompts, dispatch ready samples to free workers, start
        a train step (after every event; public for the parts that make samples ready)."""
        now = self.clock.now()
        for group in self.source.admit(self, now):
            for sample in group:
                self.advance(sample, 1, now)
        if self.evaluation is not None:
            for sample in self.evaluation.admit(self, now):
                self.advance(sample, 1, now)
        for idx in self.edges:
            self._dispatch(idx, now)
        self.training.maybe_start()

    def advance(self, sample: Sample, idx: int, now: float) -> None:
        """Move a sample to stage ``idx``: run Python stages at once, queue model stages (the
        one way a part that held a sample, a tool call or a regenerated group, hands it on)."""
        evaluated = held_out(sample.group_id)
        if not evaluated and self.ledger.settled(sample.group_id):
            return  # its group was skipped (a stage function failed, on_error=skip)
        while True:
            sample.reached[idx] = now
            node = self.order[idx]
            if evaluated and node.kind == "reference":  # (logprobs for the KL term: none to train)
                idx += 1
                continue
            if evaluated and node.kind in BARRIERS:
                assert self.evaluation is not None
                self.evaluation.arrive(self, sample, now)  # an evaluation sample is done
                return
            if node.kind in SERVED:
                self.edges[idx].push(sample, now)
                return
            if node.kind == "map":
                ran, pending = user_code.guard(self, stages.apply_map_fn, node, sample)
                if not ran:
                    return
                if pending is not None:  # an async def's call: awaited, then it goes on
                    self.calls.start(idx, [sample], pending)
                    return
                idx += 1
                continue
            group = self.barriers.arrive(idx, sample)
            if group is not None:
                self._on_group(idx, group, now)
            return

    def _on_group(self, idx: int, group: list[Sample], now: float,
                  out: Any = stages.CALL) -> None:
        node = self.order[idx]
        if node.kind == "group":
            ran, pending = user_code.guard(self, stages.apply_group_fn, node, group, out)
            if not ran:
                return
            if pending is not None:  # an async def's call: awaited, then back here with out
                self.calls.start(idx, group, pending)
                return
        elif node.kind == "filter":
            ran, keep = user_code.guard(self, stages.keep_group, node, group, out)
            if not ran:
                return
            if not isinstance(keep, bool):  # (as for a group stage)
                self.calls.start(idx, group, keep)
                return
            if not keep:
                dropped, limit = self.drop_group(group[0].group_id, filtered=True)
                if dropped > limit:
                    self.fail(GraphError(
                        f"filter {node.name!r} at {node.where} dropped {dropped} groups since "
                        f"the last optimizer step (limit {limit}): nothing is left to train on; "
                        "check the reward, or raise max_filtered_per_step"))
                return
        else:  # train
            if self.partial is None or not self.partial.refused(group, now):
                self.train_buffer.add(group)
            return
        for sample in group:
            self.advance(sample, idx + 1, now)

    def rollout_done(self, sample: Sample, idx: int) -> None:
        """Generate stage ``idx`` finished ``sample``'s rollout (its last turn): the task's
        check of it, and the texts a stage names (``prompt_text``, ``sequence_text``)."""
        self.source.check(sample)
        if self.wants_texts:
            stages.write_texts(sample, self.tok[self.order[idx].model or ""])

    def stage_call_done(self, idx: int, samples: list[Sample], out: Any) -> None:
        """An ``async def`` stage function's call on ``samples`` returned ``out``
        (async_calls.py): written and moved on as if it had returned inline (``stages.CALL``:
        call it again, for a restored snapshot's group)."""
        now = self.clock.now()
        node = self.order[idx]
        if node.kind != "map":
            self._on_group(idx, samples, now, out)
        elif user_code.guard(self, stages.apply_map_fn, node, samples[0], out)[0]:
            self.advance(samples[0], idx + 1, now)

    def use_placement(self, store_dir_for: Callable[[str], str] | None,
                      rendezvous_for: Callable[[str, int], str] | None) -> None:
        """A launcher that places workers on several nodes: each worker's store copy (its
        Welcome names it), and the trainers' group rendezvous on the first rank's node."""
        if store_dir_for is not None:
            self.store_dir_for = store_dir_for
        if rendezvous_for is not None:
            self.training.use_rendezvous(rendezvous_for)

    def assign_role(self, w: WorkerHandle) -> None:
        """Tell a worker to load its pool's role (on joining, or after a shift moved it); it
        holds as many jobs as the role's ``max_batch`` option."""
        pool = self.pools[w.pool]
        opts = self.role_options.get(pool.name, {})
        w.assigned(pool.role, pool.model, int(opts.get("max_batch", defaults.MAX_BATCH)))
        self.send(w.worker_id, AssignRole(role=pool.role, model=pool.model, options=opts,
                                          keep=self.cfg.warm_roles))

    def set_max_batch(self, pool: str, batch: int) -> None:
        """The batch ``pool``'s workers hold from now on (a drifting workload's engine fits
        fewer sequences as they grow): the role option a worker joining gets, and each
        worker's job slots now."""
        self.role_options.setdefault(pool, {})["max_batch"] = batch
        for w in self.pools[pool].workers:
            self.workers[w].set_capacity(batch)

    def resume_at(self, version: int, tokens_generated: int) -> None:
        """A snapshot's policy version and tokens generated so far (before ``run``)."""
        self.version, self.tokens_generated = version, tokens_generated

    def drop_group(self, group_id: int, *, filtered: bool) -> tuple[int, int]:
        """Settle a group that will not be trained: a filter dropped it (``filtered``) or a
        stage function failed on it (on_error=skip). Its samples still queued or generating
        are dropped when they come back. Returns the groups dropped since the last optimizer
        step and the limit past which nothing is left to train on (the caller says why)."""
        self.ledger.count_dropped(filtered=filtered)
        self.ledger.settle(group_id)
        self.train_buffer.dropped(group_id)
        self.barriers.take_group(group_id)
        self.filtered_since_step += 1
        return self.filtered_since_step, self.cfg.max_filtered_per_step * self.source.groups_per_step

    def _dispatch(self, idx: int, now: float) -> None:
        if self.collector.waiting:
            return  # a checkpoint is collecting partial states
        edge = self.edges[idx]
        node = self.order[idx]
        pool = self.pools[node.pool or ""]
        workers = self.workers
        tok = self.tok[node.model or ""]
        generate, turns = node.kind == "generate", idx in self.tools.turns
        partial = self.partial is not None
        while len(edge):
            # the ready worker with the most free slots (the first of equals); inline, since
            # this runs on every result (a simulated 128-GPU cluster: millions of times)
            worker, free = None, 0
            for wid in pool.workers:
                h = workers[wid]
                if h.state == "ready" and h.capacity - len(h.jobs) > free:
                    worker, free = h, h.capacity - len(h.jobs)
            if worker is None:
                return
            n = min(free, len(edge), self.cfg.max_jobs_per_frame)
            jobs = []
            for sample in edge.pop_many(n, now):
                job_id = self.jobs.new_id()
                if generate:
                    if partial and FIRST not in sample.private and not held_out(sample.group_id):
                        sample.private[FIRST] = self.version
                        self.train_buffer.started(sample.group_id, self.version)
                    job = stages.generate_job(node, sample, job_id, tok, self.version)
                    if turns:
                        job = self.tools.job(idx, job, sample)
                elif node.kind == "reference":
                    job = stages.response_score_job(sample, job_id)
                elif node.kind == "critic":  # (the critic as new as the policy)
                    job = stages.response_score_job(sample, job_id, self.version)
                elif node.kind == "reward_model":
                    ran, job = user_code.guard(self, stages.reward_job, node, sample, job_id, tok)
                    if not ran:
                        continue
                else:
                    ran, job = user_code.guard(self, stages.judge_job, node, sample, job_id, tok)
                    if not ran:
                        continue
                self.jobs.sent(job_id, sample, idx, worker, now)
                jobs.append(job)
            if jobs:  # (none when a judge template failed on each, on_error=skip)
                self.send(worker.worker_id, Jobs(jobs=jobs))

    def job_rtt_us_p50(self, worker: bool = False) -> dict[str, float | None]:
        """Per model stage, the median time from sending a job to its result (controller's
        view: includes the worker's queueing, any weight refresh, and the engine's work), or
        with ``worker`` the median time the worker held the job (arrival to result sent)."""
        times = self.jobs.worker_s if worker else self.jobs.rtt_s
        return {self.order[i].name: statistics.median(d) * 1e6 if d else None
                for i, d in times.items()}

    def lost_groups(self) -> list[int]:
        """Admitted groups that are nowhere in the controller (see records.lost_groups)."""
        return lost_groups(self)

    def step_record(self, batch: list[list[Sample]], msg: TrainDone) -> dict[str, Any]:
        """The metrics.jsonl line of one optimizer step (keys are an interface: docs/records.md)."""
        return step_record(self, batch, msg)
