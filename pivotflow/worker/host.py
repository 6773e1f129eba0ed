"""The worker's state machine with no socket: which role it hosts, and what each message does.

``RoleHost`` takes one controller message at a time and returns the messages to send back; it
knows nothing of threads or sockets. The real worker runs it on its compute thread
(``compute.py``) behind the socket loop (``main.py``); the simulator's worker
(``sim/sim_worker.py``) runs the same state machine with simulated roles (``sim/sim_roles.py``,
its ``make_role``) on the virtual clock, with no parameter store (its weights are a version
number) and the release times of its cost model (``release_s``).

Warm roles (``--set warm_roles=true``, AssignRole.keep): a worker keeps each role it leaves
loaded and takes it back with nothing to load, as a hybrid engine keeps its actor and rollout
in one process. It costs memory for every role a worker has held (on the tiny CPU models,
nothing to speak of; on a GPU, what the roles' weights, caches and optimizer state need side by
side), and it saves the load, the engine's start and, for a trainer that took the pool's last
step, the trainers' group forming again (measured in bench/elastic.py --warm-roles).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from pivotflow.errors import WorkerError
from pivotflow.params.base import ParamStore
from pivotflow.protocol import (
    AbortJobs,
    AssignRole,
    GenerateJob,
    JobDone,
    Jobs,
    JobsDone,
    RoleReady,
    ToController,
    ToWorker,
    TrainDone,
    TrainStep,
)
from pivotflow.worker.worker_config import worker_config

log = logging.getLogger("pivotflow.worker")


class Role(Protocol):
    """What every role has: the weights' version it holds, how long it took to start, and a way
    to let go of its memory."""

    @property
    def version(self) -> int: ...
    @property
    def load_s(self) -> float: ...
    @property
    def warmup_s(self) -> float: ...

    def release(self) -> None: ...


class GenerateLike(Role, Protocol):
    """A role that serves generation jobs by continuous batching, one engine step at a time."""

    def add(self, jobs: list[GenerateJob]) -> list[JobDone]: ...
    def has_work(self) -> bool: ...
    def step(self) -> list[JobDone]: ...
    def abort(self, job_ids: list[int]) -> list[JobDone]: ...


class TrainLike(Role, Protocol):
    """A role that takes one optimizer step per TrainStep."""

    def train(self, msg: TrainStep) -> TrainDone: ...


# roles that serve GenerateJobs (GenerateLike): an engine that generates, a reference that scores
SERVING = ("generate", "score")

# (role name, store, model, options) -> the loaded role; raises WorkerError for an unknown role
RoleFactory = Callable[[str, ParamStore | None, str, dict[str, Any]], Role]


def load_role(role: str, store: ParamStore | None, model: str, options: dict[str, Any]) -> Role:
    """The real roles: a torch (or vLLM/SGLang) engine, or the trainer."""
    if store is None:
        raise WorkerError(f"role {role!r} reads its weights from a parameter store; "
                          "this host has none")
    import torch  # the host itself is torch-free; the real roles are not

    torch.set_num_threads(int(options.get("threads", 1)))
    if role == "generate":
        from pivotflow.worker.generate_role import GenerateRole

        return GenerateRole(store, model, options)
    if role == "train":
        from pivotflow.worker.train_role import TrainRole

        return TrainRole(store, model, options)
    if role == "score":
        from pivotflow.worker.score_role import ScoreRole

        return ScoreRole(store, model, options)
    raise WorkerError(f"unknown role {role!r} (expected one of {', '.join(SERVING + ('train',))})")


class RoleHost:
    """One role at a time, and the jobs it serves. Not thread-safe: one thread drives it."""

    def __init__(self, worker_id: str, store: ParamStore | None,
                 make_role: RoleFactory = load_role,
                 release_s: Callable[[Role | None], float] | None = None) -> None:
        self.worker_id = worker_id
        self.store = store
        self.make_role = make_role
        # What RoleReady reports for letting go of the role before (None passed when there was
        # none): by default the time the release took here; a simulated worker spends its cost
        # model's figure on the virtual clock before it calls the host, and reports that.
        self.release_s = release_s
        self.role: Role | None = None
        self.role_name = ""
        self.role_model = ""
        # warm roles (AssignRole.keep): the roles left, still loaded, by (role, model)
        self.parked: dict[tuple[str, str], Role] = {}
        self.results_per_frame = 0  # 0: every result finished in a step shares one frame

    def handle(self, msg: ToWorker) -> list[ToController]:
        """Act on one message; returns what to send. Raises WorkerError for a message this
        role cannot take (jobs without a generate or score role, a train step without the train
        role), and whatever the role raises."""
        match msg:
            case Jobs(jobs=jobs):
                rejected = self._generator("jobs").add(list(jobs))
                return [JobsDone(results=rejected)] if rejected else []
            case TrainStep():
                return [self._trainer().train(msg)]
            case AbortJobs(job_ids=ids):
                if self.role_name not in SERVING:
                    return []  # nothing runs that an abort could stop
                return [JobsDone(results=self._generator("an abort").abort(list(ids)))]
            case AssignRole():
                return [self._assign(msg)]
            case _:
                log.warning("worker %s ignores %s", self.worker_id, type(msg).__name__)
                return []

    def has_work(self) -> bool:
        """Whether an engine step would do anything (a generate or score role with jobs out)."""
        return self.role_name in SERVING and self._generator("a step").has_work()

    def step(self) -> list[ToController]:
        """One engine step; the jobs it finished, in frames of ``results_per_frame``."""
        done = self._generator("a step").step()
        n = self.results_per_frame or len(done) or 1
        return [JobsDone(results=done[i : i + n]) for i in range(0, len(done), n)]

    def release(self) -> None:
        """Let go of the role's memory, and of every parked role's (idempotent)."""
        role, self.role, self.role_name, self.role_model = self.role, None, "", ""
        parked, self.parked = list(self.parked.values()), {}
        for r in ([role] if role is not None else []) + parked:
            r.release()

    def resumes(self, msg: AssignRole) -> bool:
        """Whether ``msg`` takes a parked role back (nothing to load)."""
        return msg.keep and (msg.role, msg.model) in self.parked

    def _assign(self, msg: AssignRole) -> RoleReady:
        before = self.role
        t0 = time.perf_counter()
        if msg.keep:  # park the role held now; the other parked ones stay
            if self.role is not None:
                self.parked[(self.role_name, self.role_model)] = self.role
            self.role, self.role_name, self.role_model = None, "", ""
        else:
            self.release()
        release_s = time.perf_counter() - t0
        if self.release_s is not None:
            release_s = 0.0 if msg.keep else self.release_s(before)
        options = dict(msg.options)
        self.results_per_frame = worker_config(options).results_per_frame
        warm = self.parked.pop((msg.role, msg.model), None)  # (none left without keep)
        # A parked role holds what it held when it was left: a generate role refreshes its
        # weights when a job asks for a newer version; a trainer's state is current when it
        # took the pool's last step, which the controller checks before it skips a regroup.
        self.role = warm if warm is not None else self.make_role(msg.role, self.store,
                                                                 msg.model, options)
        self.role_name, self.role_model = msg.role, msg.model
        if warm is not None:
            return RoleReady(role=msg.role, model=msg.model, version=warm.version,
                             release_s=release_s, resumed=True)
        return RoleReady(role=msg.role, model=msg.model, version=self.role.version,
                         load_s=self.role.load_s, release_s=release_s,
                         warmup_s=self.role.warmup_s)

    def _generator(self, what: str) -> GenerateLike:
        if self.role_name not in SERVING:
            raise WorkerError(f"worker {self.worker_id} got {what} without a generate or score "
                              f"role (it holds {self.role_name or 'no role'})")
        return self.role  # type: ignore[return-value]

    def _trainer(self) -> TrainLike:
        if self.role_name != "train":
            raise WorkerError(f"worker {self.worker_id} got a train step without the train "
                              f"role (it holds {self.role_name or 'no role'})")
        return self.role  # type: ignore[return-value]
