"""A simulated worker: speaks the real protocol to the real controller, costs come from the
cost model, time is virtual.

One ``SimWorker`` stands for one group of ``gpus`` GPUs. Its roles and jobs are the real
worker's state machine, ``RoleHost`` (``worker/host.py``), with the simulated roles of
``sim_roles.py`` ("generate", rollout or judge, on a ``SimBatchEngine``; "train"): every
AssignRole, Jobs, AbortJobs and TrainStep goes to ``host.handle`` and what it returns is sent.
What is left here is the simulator's stand-in for the real worker's socket loop and compute
thread (``worker/main.py``, ``worker/compute.py``): the handshake and heartbeats; the virtual
time a role load or a train step takes (the worker is busy for it, then calls the host), and
the messages that wait meanwhile; the timer that calls ``host.step`` at the engine's next
completion; cores shared with other workers on a CPU machine (``cores.py``); the stats.

The worker reacts to messages in callbacks on the loop (``LocalWorkerEnd.on_message``), not in
a task per worker; messages that arrive while it loads a role or trains wait, in order, as
they would in a real worker's socket.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from typing import Any

from pivotflow.errors import WorkerError
from pivotflow.protocol import (
    PROTOCOL_VERSION,
    AbortJobs,
    AssignRole,
    Heartbeat,
    Hello,
    Jobs,
    JobsDone,
    Shutdown,
    ToController,
    ToWorker,
    TrainStep,
    Welcome,
    WorkerFailed,
)
from pivotflow.sim.cores import CoreShare
from pivotflow.sim.cost_model import CostModel
from pivotflow.sim.sim_engine import SimBatchEngine
from pivotflow.sim.sim_roles import SimGenerateRole, SimRoles, SimTrainRole, SimWorkerStats
from pivotflow.sim.tokens import SimTokenizer
from pivotflow.transport.local import LocalWorkerEnd
from pivotflow.worker.host import RoleHost

__all__ = ["SimWorker", "SimWorkerStats"]


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
        self.stats = SimWorkerStats()
        self._timer: asyncio.TimerHandle | None = None
        self._beat: asyncio.TimerHandle | None = None
        self._busy: asyncio.TimerHandle | None = None  # loading a role or training
        self._busy_end = 0.0  # when the work behind ``_busy`` ends
        self._busy_done: Any = None  # what runs then
        self._baked = 1.0  # the slowdown from shared cores its duration already holds
        self.cores = cores  # shared with the other workers on a CPU machine, else None
        self._waiting: deque[Any] = deque()  # messages that arrived while busy
        self._stopped: asyncio.Future[None] | None = None
        self._last_sent = 0.0
        self._loop = asyncio.get_event_loop()
        self.roles = SimRoles(cost, gpus, tok, self._now, self.stats, cores, self)
        self.host = RoleHost(self.worker_id, None, self.roles, release_s=self.roles.release_s)

    # what the role is, for probes (bench/sim_gap.py): as a real worker's, it changes when the
    # new role is ready, not when the load starts

    @property
    def role(self) -> str:
        return self.host.role_name

    @property
    def model_name(self) -> str:
        role = self.host.role
        return role.model if isinstance(role, SimGenerateRole | SimTrainRole) else ""

    @property
    def engine(self) -> SimBatchEngine | None:
        gen = self._generating()
        return gen.engine if gen is not None else None

    def _generating(self) -> SimGenerateRole | None:
        role = self.host.role
        return role if isinstance(role, SimGenerateRole) else None

    # ------------------------------------------------------------ plumbing

    def _now(self) -> float:
        return self._loop.time()

    def _send(self, msg: Any) -> None:
        self._last_sent = self._loop.time()
        self.end.send(msg)

    def _send_all(self, msgs: Iterable[ToController]) -> None:
        for msg in msgs:
            self._send(msg)

    def _heartbeat(self) -> None:
        now = self._loop.time()
        if now - self._last_sent >= self.heartbeat_s * 0.999:
            gen = self._generating()
            self._send(Heartbeat(worker_id=self.worker_id, busy=len(gen.jobs) if gen else 0))
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
        gen = self._generating()
        if self._busy is not None:
            self._busy.cancel()
            b = self._baked
            self._busy_end = now + (self._busy_end - now) * max(1.0, new / b) / max(1.0, old / b)
            self._busy = self._loop.call_at(self._busy_end, self._busy_done)
        elif gen is not None:
            gen.rescale(new)
            self._schedule()

    def _idle_if_done(self) -> None:
        if self.cores is not None and self._busy is None and not self.host.has_work():
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
                if self._host(msg, [j.job_id for j in jobs]) is not None:
                    self._schedule()  # nothing to send: the jobs come back as they finish
            case AbortJobs():
                self._abort(msg)
            case TrainStep():
                self._train(msg)
            case _:
                self._send(
                    WorkerFailed(error=f"simulated worker cannot handle {type(msg).__name__}")
                )

    def _host(self, msg: ToWorker, job_ids: list[int] | None = None) -> list[ToController] | None:
        """``msg`` through the host, sending what it answers; None (after a WorkerFailed for
        ``job_ids``) where the host refused it. An abort that found no job is not answered:
        the real worker's empty JobsDone is only a sign of life to the controller, and the
        simulator never sent one."""
        try:
            out = self.host.handle(msg)
        except WorkerError as exc:
            self._send(WorkerFailed(error=str(exc), job_ids=job_ids or []))
            return None
        self._send_all(m for m in out if not (isinstance(m, JobsDone) and not m.results))
        return out

    # ------------------------------------------------------------ messages that take time

    def _assign(self, msg: AssignRole) -> None:
        gen = self._generating()
        if gen is not None and gen.jobs:  # the controller aborts before it reassigns
            self._send(
                WorkerFailed(error="role changed with jobs in flight", job_ids=sorted(gen.jobs))
            )
            return
        # warm roles: the role left stays loaded (no release), and one taken back loads nothing.
        # Right where every role a worker takes fits in its memory side by side (the CPU
        # workloads); a GPU would offload a parked role and pay the load modelled without it.
        took = (0.0 if msg.keep else self.roles.release_s(self.host.role)) + (
            0.0 if self.host.resumes(msg) else self.roles.load_s(msg.role, msg.model))
        self._until(took, self._assigned, msg, self._loop.time())

    def _assigned(self, msg: AssignRole, t: float, took: float) -> None:
        self.stats.loads.append((t, msg.role, msg.model, took))
        gen = self._generating()
        if msg.keep and gen is not None:  # parked, not released: bank its busy time now
            gen.bank_busy()
        self._host(msg)  # releases the role before and loads this one, at the load's end

    def _train(self, msg: TrainStep) -> None:
        role = self.host.role
        if not isinstance(role, SimTrainRole):
            self._host(msg)  # not a trainer: the host says so
            return
        seconds, baked = role.plan(msg)
        self._until(seconds, self._trained, msg, baked=baked)

    def _trained(self, msg: TrainStep, took: float) -> None:
        self._host(msg)  # the step ends now: its TrainDone

    # ------------------------------------------------------------ the engine

    def _abort(self, msg: AbortJobs) -> None:
        if self._host(msg) is not None and self._generating() is not None:
            self._idle_if_done()
            self._schedule()

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        gen = self._generating()
        when = gen.next_completion() if gen is not None else None
        if when is not None:
            self._timer = self._loop.call_at(when, self._complete)

    def _complete(self) -> None:
        """The engine reached its next completion: the host's engine step returns what
        finished."""
        self._timer = None
        if self._generating() is None:
            return
        self._send_all(self.host.step())
        self._idle_if_done()
        self._schedule()

    def busy_by_role(self) -> dict[str, float]:
        """Virtual seconds this worker's GPUs spent busy, per role it hosted."""
        gen = self._generating()
        if gen is not None:
            gen.bank_busy()
        return dict(self.stats.busy_s)
