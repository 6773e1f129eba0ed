"""A simulated worker: speaks the real protocol to the real controller, costs come from the
cost model, time is virtual.

One ``SimWorker`` stands for one group of ``gpus`` GPUs. It hosts one role at a time, as a real
worker does: "generate" (rollout or judge, a ``SimBatchEngine``) or "train". Its outputs are
real token ids of the char tokenizer, of the lengths a real model would produce: a response
length drawn from the workload's log-normal by the job's seed (so a migrated sequence ends
where it would have), a verdict of ``verdict_tokens`` ending in ":Yes"/":No".

What a job returns (lengths, verdicts, compact payloads) is in ``outputs.py``.

The worker reacts to messages in callbacks on the loop (``LocalWorkerEnd.on_message``), not in
a task per worker; messages that arrive while it loads a role or trains wait, in order, as
they would in a real worker's socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pivotflow.protocol import (
    PROTOCOL_VERSION,
    AbortJobs,
    AssignRole,
    GenerateJob,
    Heartbeat,
    Hello,
    JobDone,
    Jobs,
    JobsDone,
    RoleReady,
    Shutdown,
    TrainDone,
    TrainStep,
    Welcome,
    WorkerFailed,
)
from pivotflow.sim.cores import CoreShare
from pivotflow.sim.cost_model import CostModel
from pivotflow.sim.outputs import Outputs, response_length
from pivotflow.sim.sim_engine import SimBatchEngine
from pivotflow.sim.tokens import SimTokenizer
from pivotflow.transport.local import LocalWorkerEnd

_TRAIN_DONE_RANK = "rank" in TrainDone.__struct_fields__


@dataclass(slots=True)
class SimWorkerStats:
    """What one simulated worker did (virtual seconds)."""

    loads: list[tuple[float, str, str, float]] = field(default_factory=list)  # t, role, model, s
    busy_s: dict[str, float] = field(default_factory=dict)  # "rollout"/"genrm"/"train" -> s
    jobs_done: int = 0
    jobs_aborted: int = 0
    tokens: int = 0


class SimWorker:
    """One GPU group behind a ``LocalWorkerEnd``; ``run()`` serves until Shutdown."""

    def __init__(
        self,
        end: LocalWorkerEnd,
        cost: CostModel,
        gpus: int,
        tok: SimTokenizer,
        heartbeat_s: float = 1.0,
        cores: CoreShare | None = None,
    ) -> None:
        self.end, self.cost, self.gpus, self.tok = end, cost, gpus, tok
        self.worker_id = end.worker_id
        self.heartbeat_s = heartbeat_s
        self.role, self.model_name = "", ""
        self.version = 0
        self.engine: SimBatchEngine | None = None
        self.jobs: dict[int, GenerateJob] = {}
        self.targets: dict[int, tuple[int, bool]] = {}  # job -> (total new tokens, stopped)
        self.stats = SimWorkerStats()
        self._timer: asyncio.TimerHandle | None = None
        self._beat: asyncio.TimerHandle | None = None
        self._busy: asyncio.TimerHandle | None = None  # loading a role or training
        self._busy_end = 0.0  # when the work behind ``_busy`` ends
        self._busy_done: Any = None  # what runs then
        self._baked = 1.0  # the slowdown from shared cores its duration already holds
        self._group = (-1, 1)  # (epoch, world) of the trainers' group this worker is in
        self.cores = cores  # shared with the other workers on a CPU machine, else None
        self._waiting: deque[Any] = deque()  # messages that arrived while busy
        self._stopped: asyncio.Future[None] | None = None
        self._last_sent = 0.0
        self._loop = asyncio.get_event_loop()
        self.out = Outputs(tok, cost.wl.p_yes)

    # ------------------------------------------------------------ plumbing

    def _send(self, msg: Any) -> None:
        self._last_sent = self._loop.time()
        self.end.send(msg)

    def _heartbeat(self) -> None:
        now = self._loop.time()
        if now - self._last_sent >= self.heartbeat_s * 0.999:
            self._send(Heartbeat(worker_id=self.worker_id, busy=len(self.jobs)))
        self._beat = self._loop.call_at(self._last_sent + self.heartbeat_s, self._heartbeat)

    async def run(self) -> None:
        """Join the controller, then serve messages in order until Shutdown."""
        self._loop = asyncio.get_running_loop()
        self._stopped = self._loop.create_future()
        self.end.on_message = self._on_message
        self._send(Hello(protocol_version=PROTOCOL_VERSION, worker_id=self.worker_id, pid=0))
        try:
            await self._stopped
        finally:
            for h in (self._timer, self._beat, self._busy):
                if h is not None:
                    h.cancel()
            self.end.on_message = None
            self.end.close()

    def _on_message(self, msg: Any) -> None:
        if self._busy is not None or self._waiting:
            self._waiting.append(msg)
        else:
            self._handle(msg)

    def _until(self, seconds: float, then: Any, *args: Any, baked: float = 1.0) -> None:
        """Busy for ``seconds`` of work: then ``then(*args)`` and the messages that waited
        meanwhile. ``then`` gets the seconds it took (longer when cores are shared beyond the
        ``baked`` slowdown the figure already holds)."""
        start = self._loop.time()

        def done() -> None:
            self._busy = None
            self._idle_if_done()
            then(*args, self._loop.time() - start)
            while self._waiting and self._busy is None:
                self._handle(self._waiting.popleft())

        if self.cores is not None:
            self.cores.enter(self)
            seconds *= max(1.0, self.cores.factor / baked)
        self._busy_end, self._busy_done, self._baked = start + seconds, done, baked
        self._busy = self._loop.call_at(self._busy_end, done)

    def rescale(self, old: float, new: float) -> None:
        """Cores shared (``sim/cores.py``): what is left of the current work stretches."""
        now = self._loop.time()
        if self._busy is not None:
            self._busy.cancel()
            b = self._baked
            self._busy_end = now + (self._busy_end - now) * max(1.0, new / b) / max(1.0, old / b)
            self._busy = self._loop.call_at(self._busy_end, self._busy_done)
        elif self.engine is not None:
            self.engine.rescale(now, new)
            self._schedule()

    def _idle_if_done(self) -> None:
        if self.cores is not None and self._busy is None and not (self.engine and self.engine.seqs):
            self.cores.leave(self)

    def _handle(self, msg: Any) -> None:
        match msg:
            case Shutdown():
                if self._stopped is not None and not self._stopped.done():
                    self._stopped.set_result(None)
            case Welcome(heartbeat_s=hb):
                self.heartbeat_s = hb
                self._heartbeat()
            case AssignRole():
                self._assign(msg)
            case Jobs(jobs=jobs):
                self._add_jobs(jobs)
            case AbortJobs(job_ids=ids):
                self._abort(list(ids) or list(self.jobs))
            case TrainStep():
                self._train(msg)
            case _:
                self._send(
                    WorkerFailed(error=f"simulated worker cannot handle {type(msg).__name__}")
                )

    # ------------------------------------------------------------ roles

    def _assign(self, msg: AssignRole) -> None:
        if self.jobs:  # the controller aborts before it reassigns: anything else is a bug
            self._send(
                WorkerFailed(error="role changed with jobs in flight", job_ids=sorted(self.jobs))
            )
            return
        release = self.cost.hw.release_s if self.role else 0.0
        m = self.cost.model(msg.model)
        load = self.cost.load_s(msg.role, m)
        self._until(release + load, self._assigned, msg, self._loop.time(), release, load)

    def _assigned(
        self, msg: AssignRole, t: float, release: float, load: float, took: float
    ) -> None:
        self._bank_busy()
        self.role, self.model_name = msg.role, msg.model
        self.engine = None
        self._group = (-1, 1)  # a new role: no trainers' group
        m = self.cost.model(msg.model)
        if msg.role == "generate":
            self.engine = SimBatchEngine(self.cost, m, self.gpus, self._loop.time())
        self.stats.loads.append((t, msg.role, msg.model, took))
        self._send(
            RoleReady(
                role=msg.role, model=msg.model, version=self.version, load_s=load,
                release_s=release, warmup_s=self.cost.warmup_s(m)
            )
        )

    def _key(self) -> str:
        return "train" if self.role == "train" else f"generate:{self.model_name}"

    def _bank_busy(self) -> None:
        if self.engine is not None:
            key = self._key()
            self.stats.busy_s[key] = self.stats.busy_s.get(key, 0.0) + self.engine.busy_s
            self.engine.busy_s = 0.0

    def busy_by_role(self) -> dict[str, float]:
        """Virtual seconds this worker's GPUs spent busy, per role it hosted."""
        self._bank_busy()
        return dict(self.stats.busy_s)

    def _target(self, job: GenerateJob) -> tuple[int, bool]:
        """Total tokens this job's sequence generates and whether it ends with EOS."""
        # A drifting workload's lengths are those of the policy version that generates the
        # sequence: the version its first token came from (a migrated one keeps its length).
        step = job.prefix_versions[0] if job.prefix_versions else self.version
        if self.model_name == "judge":
            return self.cost.verdict_at(job.min_version), True
        n, stop = response_length(self.cost.response_at(step), job.seed, job.max_tokens)
        if n < job.min_tokens:  # as a real engine, no EOS before min_tokens
            n = min(job.min_tokens, job.max_tokens)
            stop = n < job.max_tokens
        return n, stop

    def _add_jobs(self, jobs: list[GenerateJob]) -> None:
        eng = self.engine
        if eng is None:
            self._send(
                WorkerFailed(
                    error=f"jobs sent to a {self.role or 'roleless'} worker",
                    job_ids=[j.job_id for j in jobs],
                )
            )
            return
        now = self._loop.time()
        need = max(j.min_version for j in jobs)
        m = eng.model
        if need > self.version:
            eng.stall(now, self.cost.weight_sync_s(m))
            self.version = need
        if self.cores is not None:
            self.cores.enter(self)
            eng.rescale(now, self.cores.factor)
        lengths = [len(j.prompt_ids) + len(j.prefix_ids) for j in jobs]
        eng.stall(now, self.cost.prefill_batch_s(m, lengths) / eng.r)
        for j in jobs:
            total, stop = self._target(j)
            self.jobs[j.job_id] = j
            self.targets[j.job_id] = (total, stop)
            eng.join(j.job_id, len(j.prompt_ids) + len(j.prefix_ids), total - len(j.prefix_ids))
        self._schedule()

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        when = self.engine.next_completion() if self.engine is not None else None
        if when is not None:
            self._timer = self._loop.call_at(when, self._complete, when)

    def _complete(self, when: float) -> None:
        self._timer = None
        eng = self.engine
        if eng is None:
            return
        results = [
            self._result(seq.job_id, seq.end - seq.start, final=True)
            for seq in eng.pop_finished(when)
        ]
        if results:
            self.stats.jobs_done += len(results)
            self._send(JobsDone(results=results))
        self._idle_if_done()
        self._schedule()

    def _abort(self, job_ids: list[int]) -> None:
        eng = self.engine
        if eng is None:
            return
        eng.advance(self._loop.time())
        out = []
        for job_id in job_ids:
            got = eng.remove(job_id)
            if got is not None:
                out.append(self._result(job_id, got[1], final=False))
        self.stats.jobs_aborted += len(out)
        if out:
            self._send(JobsDone(results=out))
        self._idle_if_done()
        self._schedule()

    def _result(self, job_id: int, new: int, *, final: bool) -> JobDone:
        """The job's tokens so far (prefix + ``new``); on completion the full sequence."""
        job = self.jobs.pop(job_id)
        _, stop = self.targets.pop(job_id)
        self.stats.tokens += new
        judge = self.model_name == "judge"
        return self.out.result(job, new, final=final, stop=stop, judge=judge, version=self.version)

    def _train(self, msg: TrainStep) -> None:
        if self.role != "train":
            self._send(WorkerFailed(error=f"a train step sent to a {self.role} worker"))
            return
        tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in msg.seqs)
        world = int(getattr(msg, "world", 1))
        m = self.cost.wl.policy
        t = self.cost.train_s(tokens, len(msg.seqs), self.gpus, msg.any_signal)
        baked = 1.0  # the slowdown from shared cores already in the figure
        if world > 1:  # shards are near-equal in tokens: the batch is about world x this one
            new_group = (msg.epoch, world) != self._group
            dp = self.cost.train_world_s(tokens * world, world, msg.any_signal, new_group)
            if dp is not None:
                t = dp
                baked = max(1.0, world / self.cores.cores) if self.cores else 1.0
        self._group = (msg.epoch, world)
        if int(getattr(msg, "optim_version", -1)) >= 0:  # take over state left in the store
            t += self.cost.load_s("train", m)
        t += self.cost.weight_sync_s(m) / max(world, 1)  # publish the new version, in slices
        self._until(t, self._trained, msg, tokens, baked=baked)

    def _trained(self, msg: TrainStep, tokens: int, t: float) -> None:
        self.stats.busy_s["train"] = self.stats.busy_s.get("train", 0.0) + t
        self.version = msg.step + 1
        kw: dict[str, Any] = {"rank": int(getattr(msg, "rank", 0))} if _TRAIN_DONE_RANK else {}
        self._send(
            TrainDone(
                step=msg.step,
                version=msg.step + 1,
                stats={"sim_train_s": t, "sim_tokens": float(tokens)},
                job_ids=[s.job_id for s in msg.seqs],
                **kw,
            )
        )


async def close_quietly(task: asyncio.Task[Any]) -> None:
    """Cancel a worker task and wait for it (its end closes in ``run``'s finally)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
