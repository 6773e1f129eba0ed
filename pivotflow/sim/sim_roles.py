"""The simulator's roles, run by the real worker's state machine (``worker/host.py``'s
``RoleHost``): what one GPU group does with jobs and train steps, with costs from the cost model
and time on the virtual clock.

``SimRoles`` is the host's ``RoleFactory``. "generate" (rollout or judge) is a
``SimGenerateRole`` (``GenerateLike``): a ``SimBatchEngine`` whose outputs are real token ids of
the char tokenizer, of the lengths a real model would produce: a response length drawn from the
workload's log-normal by the job's seed (so a migrated sequence ends where it would have), a
verdict of ``verdict_tokens`` ending in ":Yes"/":No" (``outputs.py``). "train" is a
``SimTrainRole`` (``TrainLike``).

What outlives a role stays in ``SimRoles``: the version of the weights the group holds (a
trainer's last step is what the generator it becomes starts from) and the worker's stats.
Each role reads the virtual clock through ``SimRoles.clock``. A role load and a train step take
virtual time with nothing to show meanwhile: the worker (``sim_worker.py``) spends it before it
calls the host, from the figures here (``SimRoles.load_s``, ``SimRoles.release_s``,
``SimTrainRole.plan``); an engine step is a jump to the engine's next completion, which the
worker calls when the clock reaches it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pivotflow.controller.train_tokens import seq_tokens
from pivotflow.errors import WorkerError
from pivotflow.params.base import ParamStore
from pivotflow.protocol import GenerateJob, JobDone, TrainDone, TrainStep
from pivotflow.sim.cores import CoreShare, SharesCores
from pivotflow.sim.cost_model import CostModel
from pivotflow.sim.outputs import Outputs, response_length
from pivotflow.sim.sim_engine import SimBatchEngine
from pivotflow.sim.tokens import SimTokenizer
from pivotflow.worker.host import Role

_TRAIN_DONE_RANK = "rank" in TrainDone.__struct_fields__


@dataclass(slots=True)
class SimWorkerStats:
    """What one simulated worker did (virtual seconds)."""

    loads: list[tuple[float, str, str, float]] = field(default_factory=list)  # t, role, model, s
    busy_s: dict[str, float] = field(default_factory=dict)  # "generate:<model>"/"train" -> s
    jobs_done: int = 0
    jobs_aborted: int = 0
    tokens: int = 0


class SimRoles:
    """The roles of one simulated group of ``gpus`` GPUs (a ``RoleFactory``), and what they
    share: the weights' ``version``, the ``stats``, the virtual ``clock`` and, on a CPU
    machine, the ``cores`` that ``share_as`` (the worker) shares with the other workers."""

    def __init__(self, cost: CostModel, gpus: int, tok: SimTokenizer, clock: Callable[[], float],
                 stats: SimWorkerStats, cores: CoreShare | None = None,
                 share_as: SharesCores | None = None) -> None:
        self.cost, self.gpus, self.clock, self.stats = cost, gpus, clock, stats
        self.cores, self.share_as = cores, share_as
        self.version = 0
        self.out = Outputs(tok, cost.wl.p_yes)

    def __call__(self, role: str, store: ParamStore | None, model: str,
                 options: dict[str, Any]) -> SimGenerateRole | SimTrainRole:
        if role == "generate":
            return SimGenerateRole(self, model)
        if role == "train":
            return SimTrainRole(self, model)
        raise WorkerError(f"the simulator has no role {role!r} (expected generate or train)")

    def load_s(self, role: str, model: str) -> float:
        """Virtual seconds to take up ``role`` with ``model``."""
        return self.cost.load_s(role, self.cost.model(model))

    def release_s(self, role: Role | None) -> float:
        """Virtual seconds to let go of ``role`` (none without one): ``RoleHost``'s figure."""
        return self.cost.hw.release_s if role is not None else 0.0

    def enter_cores(self) -> float | None:
        """The worker starts work: how many times slower than alone it now runs on the shared
        cores (None: the group has devices of its own)."""
        if self.cores is None:
            return None
        assert self.share_as is not None  # given with ``cores``
        self.cores.enter(self.share_as)
        return self.cores.factor


class SimGenerateRole:
    """A generate role (rollout or judge) on a ``SimBatchEngine``."""

    def __init__(self, shared: SimRoles, model: str) -> None:
        self.shared, self.model = shared, model
        m = shared.cost.model(model)
        self.engine = SimBatchEngine(shared.cost, m, shared.gpus, shared.clock())
        self.jobs: dict[int, GenerateJob] = {}
        self.stops: dict[int, bool] = {}  # job -> whether its sequence ends with EOS
        self.load_s = shared.load_s("generate", model)
        self.warmup_s = shared.cost.warmup_s(m)

    @property
    def version(self) -> int:
        return self.shared.version

    def add(self, jobs: list[GenerateJob]) -> list[JobDone]:
        """Prefill ``jobs`` into the batch (after pulling the newer weights one needs)."""
        g, eng = self.shared, self.engine
        now = g.clock()
        need = max(j.min_version for j in jobs)
        if need > g.version:
            eng.stall(now, g.cost.weight_sync_s(eng.model))
            g.version = need
        slow = g.enter_cores()
        if slow is not None:
            eng.rescale(now, slow)
        lengths = [len(j.prompt_ids) + len(j.prefix_ids) for j in jobs]
        eng.stall(now, g.cost.prefill_batch_s(eng.model, lengths) / eng.r)
        for j in jobs:
            total, stop = self._target(j)
            self.jobs[j.job_id] = j
            self.stops[j.job_id] = stop
            eng.join(j.job_id, len(j.prompt_ids) + len(j.prefix_ids), total - len(j.prefix_ids))
        return []

    def has_work(self) -> bool:
        return bool(self.engine.seqs)

    def next_completion(self) -> float | None:
        """Virtual time at which ``step`` finishes its next sequences (None: nothing runs)."""
        return self.engine.next_completion()

    def step(self) -> list[JobDone]:
        """Decode to the next completion (``next_completion``; the worker calls this when the
        clock reaches it) and return every sequence finished there."""
        when = self.engine.next_completion()
        if when is None:
            return []
        done = [self._result(seq.job_id, seq.end - seq.start, final=True)
                for seq in self.engine.pop_finished(when)]
        self.shared.stats.jobs_done += len(done)
        return done

    def abort(self, job_ids: list[int]) -> list[JobDone]:
        """Stop ``job_ids`` (none: every job) at the step boundary the clock has reached."""
        self.engine.advance(self.shared.clock())
        out = []
        for job_id in job_ids or list(self.jobs):
            got = self.engine.remove(job_id)
            if got is not None:
                out.append(self._result(job_id, got[1], final=False))
        self.shared.stats.jobs_aborted += len(out)
        return out

    def rescale(self, slow: float) -> None:
        """The shared cores now make the engine ``slow`` times slower than alone."""
        self.engine.rescale(self.shared.clock(), slow)

    def bank_busy(self) -> None:
        """Add the engine's busy time since the last call to the worker's stats."""
        busy, key = self.shared.stats.busy_s, f"generate:{self.model}"
        busy[key] = busy.get(key, 0.0) + self.engine.busy_s
        self.engine.busy_s = 0.0

    def release(self) -> None:
        self.bank_busy()

    def _target(self, job: GenerateJob) -> tuple[int, bool]:
        """Total tokens this job's sequence generates and whether it ends with EOS."""
        cost = self.shared.cost
        # A drifting workload's lengths are those of the policy version that generates the
        # sequence: the version its first token came from (a migrated one keeps its length).
        step = job.prefix_versions[0] if job.prefix_versions else self.shared.version
        if self.model == "judge":  # (its weights are the judge's: no policy version on it)
            return cost.verdict_at(cost.policy_version), True
        lengths = cost.response_at(step)
        # a prompt's responses share a length component (Lengths.group_share), keyed by the
        # prompt's ids, which every response of a group (and a migrated one) carries
        group = hash(tuple(job.prompt_ids)) & 0xFFFFFFFF if lengths.group_share else 0
        n, stop = response_length(lengths, job.seed, job.max_tokens, group)
        if n < job.min_tokens:  # as a real engine, no EOS before min_tokens
            n = min(job.min_tokens, job.max_tokens)
            stop = n < job.max_tokens
        return n, stop

    def _result(self, job_id: int, new: int, *, final: bool) -> JobDone:
        """The job's tokens so far (prefix + ``new``); on completion the full sequence."""
        job = self.jobs.pop(job_id)
        stop = self.stops.pop(job_id)
        self.shared.stats.tokens += new
        return self.shared.out.result(job, new, final=final, stop=stop,
                                     judge=self.model == "judge", version=self.shared.version)


class SimTrainRole:
    """The trainer: one optimizer step per TrainStep, as long as the cost model says."""

    def __init__(self, shared: SimRoles, model: str) -> None:
        self.shared, self.model = shared, model
        self.load_s = shared.load_s("train", model)
        self.warmup_s = shared.cost.warmup_s(shared.cost.model(model))
        self._dp_group = (-1, 1)  # (epoch, world) of the trainers' group this worker is in
        self._started: float | None = None  # when the step ``plan`` timed began

    @property
    def version(self) -> int:
        return self.shared.version

    def plan(self, msg: TrainStep) -> tuple[float, float]:
        """The step's virtual seconds, and the slowdown from shared cores that figure already
        holds; the step starts now (``train`` ends it)."""
        g = self.shared
        cost = g.cost
        tokens = sum(map(seq_tokens, msg.seqs))
        world = int(getattr(msg, "world", 1))
        m = cost.wl.policy
        t = cost.train_s(tokens, len(msg.seqs), g.gpus, msg.any_signal)
        baked = 1.0
        if world > 1:  # shards are near-equal in tokens: the batch is about world x this one
            new_group = (msg.epoch, world) != self._dp_group
            dp = cost.train_world_s(tokens * world, world, msg.any_signal, new_group)
            if dp is not None:
                t = dp
                baked = max(1.0, world / g.cores.cores) if g.cores else 1.0
        self._dp_group = (msg.epoch, world)
        if int(getattr(msg, "optim_version", -1)) >= 0:  # take over state left in the store
            t += cost.load_s("train", m)
        t += cost.weight_sync_s(m) / max(world, 1)  # publish the new version, in slices
        self._started = g.clock()
        return t, baked

    def train(self, msg: TrainStep) -> TrainDone:
        """End the step ``plan`` began (its virtual seconds are what the clock moved since);
        a step not planned is planned now and takes its figure at once."""
        g = self.shared
        if self._started is None:
            took, _ = self.plan(msg)
        else:
            took = g.clock() - self._started
        self._started = None
        tokens = sum(map(seq_tokens, msg.seqs))
        g.stats.busy_s["train"] = g.stats.busy_s.get("train", 0.0) + took
        g.version = msg.step + 1
        kw: dict[str, Any] = {"rank": int(getattr(msg, "rank", 0))} if _TRAIN_DONE_RANK else {}
        return TrainDone(step=msg.step, version=msg.step + 1,
                         stats={"sim_train_s": took, "sim_tokens": float(tokens)},
                         job_ids=[s.job_id for s in msg.seqs], **kw)

    def release(self) -> None:
        pass  # nothing held beyond the weights' version, which outlives the role
