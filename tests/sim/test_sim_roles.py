"""The simulated roles (sim/sim_roles.py) driven by the real worker's state machine, RoleHost:
what each message answers, on a virtual clock the test moves as the simulated worker would."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sim_workloads import tiny

from pivotflow.errors import WorkerError
from pivotflow.protocol import (
    AbortJobs,
    AssignRole,
    GenerateJob,
    JobDone,
    Jobs,
    JobsDone,
    RoleReady,
    TrainDone,
    TrainSeq,
    TrainStep,
)
from pivotflow.sim.cost_model import CostModel
from pivotflow.sim.outputs import response_length
from pivotflow.sim.schedule import parse_schedule
from pivotflow.sim.sim_roles import SimGenerateRole, SimRoles, SimTrainRole, SimWorkerStats
from pivotflow.sim.tokens import SimTokenizer
from pivotflow.sim.workload import Workload
from pivotflow.worker.host import RoleHost, load_role

GPUS = 8


class Clock:
    """The virtual clock as the simulated worker's loop reads it: set, never slept on."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def simulated(wl: Workload) -> tuple[RoleHost, SimRoles, Clock, CostModel]:
    """A simulated worker's role host for ``wl``, its roles, virtual clock and cost model."""
    cost = CostModel(wl)
    clock = Clock()
    roles = SimRoles(cost, GPUS, SimTokenizer(compact=True), clock, SimWorkerStats())
    return RoleHost("sim-0", None, roles, release_s=roles.release_s), roles, clock, cost


@pytest.fixture
def sim(tiny_workload: Workload) -> tuple[RoleHost, SimRoles, Clock, CostModel]:
    return simulated(tiny_workload)


def job(job_id: int, seed: int, *, max_tokens: int = 4000, min_version: int = 0) -> GenerateJob:
    return GenerateJob(job_id=job_id, prompt_ids=list(range(3, 40)), max_tokens=max_tokens,
                       seed=seed, min_version=min_version)


def run_out(host: RoleHost, clock: Clock) -> list[tuple[float, JobDone]]:
    """Step the engine to each completion as the worker's timer does, until it has no work."""
    done = []
    while host.has_work():
        role = host.role
        assert isinstance(role, SimGenerateRole)
        when = role.next_completion()
        assert when is not None and when >= clock.t
        clock.t = when
        for frame in host.step():
            assert isinstance(frame, JobsDone)
            done += [(when, r) for r in frame.results]
    return done


def test_generate_returns_each_job_at_its_seeded_length(sim):
    host, roles, clock, cost = sim
    [ready] = host.handle(AssignRole(role="generate", model="policy"))
    policy = cost.model("policy")
    assert ready == RoleReady(role="generate", model="policy", version=0,
                              load_s=cost.load_s("generate", policy), release_s=0.0,
                              warmup_s=cost.warmup_s(policy))
    seeds = [11, 12, 13]
    assert host.handle(Jobs(jobs=[job(i, s) for i, s in enumerate(seeds)])) == []
    done = run_out(host, clock)
    assert sorted(r.job_id for _, r in done) == [0, 1, 2]
    times = [t for t, _ in done]
    assert times == sorted(times) and times[0] > 0.0  # the prefill comes first
    eos = SimTokenizer(compact=True).eos_id
    for _, r in done:
        n, stop = response_length(cost.response_at(0), seeds[r.job_id], 4000)
        assert len(r.token_ids) == n == len(r.versions) == len(r.logprobs)
        assert list(r.versions) == [0] * n
        assert r.finish_reason == ("stop" if stop else "length")
        assert (r.token_ids[-1] == eos) == stop
    stats = roles.stats
    assert stats.jobs_done == 3 and stats.jobs_aborted == 0
    assert stats.tokens == sum(len(r.token_ids) for _, r in done)
    host.release()  # the engine's busy time goes to the stats under its model
    assert stats.busy_s["generate:policy"] >= times[-1] - times[0] > 0.0


def test_jobs_that_end_together_come_back_in_frames_of_the_option(sim):
    host, _, clock, cost = sim
    host.handle(AssignRole(role="generate", model="policy", options={"results_per_frame": 2}))
    host.handle(Jobs(jobs=[job(i, 7) for i in range(5)]))  # one seed: one length, one step
    role = host.role
    assert isinstance(role, SimGenerateRole)
    when = role.next_completion()
    assert when is not None
    clock.t = when
    frames = host.step()
    assert [len(f.results) for f in frames if isinstance(f, JobsDone)] == [2, 2, 1]
    assert not host.has_work()


def test_abort_returns_the_tokens_generated_so_far(sim):
    host, roles, clock, cost = sim
    host.handle(AssignRole(role="generate", model="policy"))
    host.handle(Jobs(jobs=[job(0, 1, max_tokens=100_000), job(1, 2, max_tokens=100_000)]))
    role = host.role
    assert isinstance(role, SimGenerateRole)
    end = role.next_completion()
    assert end is not None
    clock.t = end / 2
    [frame] = host.handle(AbortJobs())  # none named: every job
    assert isinstance(frame, JobsDone)
    got = {r.job_id: r for r in frame.results}
    assert sorted(got) == [0, 1]
    n = len(got[0].token_ids)
    assert 0 < n == len(got[1].token_ids) == role.engine.s  # joined together: same steps
    assert all(r.finish_reason == "abort" for r in got.values())
    assert roles.stats.jobs_aborted == 2 and roles.stats.tokens == 2 * n
    assert not host.has_work()
    [empty] = host.handle(AbortJobs(job_ids=[0]))  # gone already: nothing to stop
    assert empty == JobsDone(results=[])


def test_the_version_outlives_the_role(sim):
    host, roles, clock, cost = sim
    host.handle(AssignRole(role="generate", model="policy"))
    host.handle(Jobs(jobs=[job(0, 5, min_version=2)]))  # pulls version 2 first
    [(_, r)] = run_out(host, clock)
    assert set(r.versions) == {2}
    [ready] = host.handle(AssignRole(role="train", model="policy"))
    policy = cost.model("policy")
    assert ready == RoleReady(role="train", model="policy", version=2,
                              load_s=cost.load_s("train", policy),
                              release_s=cost.hw.release_s, warmup_s=cost.warmup_s(policy))
    seqs = [TrainSeq(job_id=i, prompt_ids=[3] * 30, response_ids=[4] * 70, logprobs=[-1.0] * 70,
                     versions=[2] * 70, advantage=1.0) for i in range(4)]
    step = TrainStep(step=2, seqs=seqs)
    trainer = host.role
    assert isinstance(trainer, SimTrainRole)
    seconds, baked = trainer.plan(step)  # as the worker does before it waits
    assert seconds == cost.train_s(400, 4, GPUS, True) + cost.weight_sync_s(policy)
    assert baked == 1.0
    clock.t += seconds
    [done] = host.handle(step)
    assert isinstance(done, TrainDone)
    assert (done.step, done.version, done.job_ids) == (2, 3, [0, 1, 2, 3])
    assert done.stats == {"sim_train_s": pytest.approx(seconds, rel=1e-12), "sim_tokens": 400.0}
    assert roles.stats.busy_s["train"] == done.stats["sim_train_s"]
    [again] = host.handle(step)  # not planned: it takes its figure at once
    assert isinstance(again, TrainDone) and again.stats["sim_train_s"] == seconds
    [ready] = host.handle(AssignRole(role="generate", model="judge"))
    assert ready.version == 3 and ready.release_s == cost.hw.release_s


def test_a_judge_ends_in_its_verdict(sim):
    host, _, clock, cost = sim
    host.handle(AssignRole(role="generate", model="judge"))
    host.handle(Jobs(jobs=[job(i, 100 + i) for i in range(6)]))
    done = run_out(host, clock)
    tok = SimTokenizer(compact=True)
    yes, no = bytes(tok.encode(":Yes")), bytes(tok.encode(":No"))
    for _, r in done:
        ids = bytes(r.token_ids)
        assert len(ids) == cost.verdict_at(0)
        assert ids[:-1].endswith(yes) or ids[:-1].endswith(no)
        assert ids[-1] == tok.eos_id and r.finish_reason == "stop"


def test_what_the_simulator_cannot_take_is_refused(sim):
    host, _, _, _ = sim
    with pytest.raises(WorkerError, match="without a generate or score role"):
        host.handle(Jobs(jobs=[job(0, 1)]))
    with pytest.raises(WorkerError, match="no role 'score'"):
        host.handle(AssignRole(role="score", model="policy"))
    host.handle(AssignRole(role="generate", model="policy"))
    with pytest.raises(WorkerError, match="without the train role"):
        host.handle(TrainStep(step=0, seqs=[]))
    with pytest.raises(WorkerError, match="parameter store"):  # a real role needs one
        load_role("generate", None, "policy", {})


def test_a_judges_verdict_follows_the_runs_policy_version_on_a_drifting_workload() -> None:
    """A judge job carries no policy version (its weights are the judge's): its verdict length
    is the schedule's at the version the run is at, which the simulated cluster sets after each
    step. It once stayed at version 0's, so a drifting run's late judging was too cheap."""
    schedule = parse_schedule({"verdict_tokens": [[0, 16], [2, 48]]}, "tiny.toml")
    host, _, clock, cost = simulated(replace(tiny(), schedule=schedule))
    host.handle(AssignRole(role="generate", model="judge"))
    lengths = []
    for version in (0, 1, 2, 3):
        cost.policy_version = version
        host.handle(Jobs(jobs=[job(version, 7)]))
        [(_, r)] = run_out(host, clock)
        lengths.append(len(r.token_ids))
    assert lengths == [16, 32, 48, 48]
