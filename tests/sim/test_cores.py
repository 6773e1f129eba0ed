"""Shared cores (processor sharing) in the simulator, and the costs calibrated on the CPU run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pivotflow.sim.cluster import Split, simulate
from pivotflow.sim.cores import CoreShare
from pivotflow.sim.cost_model import CostModel
from pivotflow.sim.sim_engine import SimBatchEngine
from pivotflow.sim.workload import Workload, load_workload
from pivotflow.tasks.length_budget import budget_length

CPU = Path(__file__).parents[2] / "bench/workloads/cpu_tiny_longtail.toml"
CPU_W2 = Path(__file__).parents[2] / "bench/workloads/cpu_tiny_longtail_w2.toml"


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[float, float]] = []

    def rescale(self, old: float, new: float) -> None:
        self.calls.append((old, new))


def test_busy_workers_beyond_the_cores_slow_the_others() -> None:
    share = CoreShare(2)
    a, b, c = Recorder(), Recorder(), Recorder()
    share.enter(a)
    share.enter(b)
    assert share.factor == 1.0 and a.calls == []  # two busy on two cores: full speed
    share.enter(c)
    assert share.factor == 1.5 and a.calls == [(1.0, 1.5)] and b.calls == [(1.0, 1.5)]
    assert c.calls == []  # the one joining starts at the new speed itself
    share.enter(c)  # already busy: nothing changes
    share.leave(a)
    assert share.factor == 1.0 and b.calls[-1] == (1.5, 1.0) and c.calls == [(1.5, 1.0)]
    share.leave(a)  # not busy: nothing changes
    assert len(b.calls) == 2


def test_a_slowed_engine_takes_proportionally_longer(tiny_workload: Workload) -> None:
    cost = CostModel(tiny_workload)
    eng = SimBatchEngine(cost, tiny_workload.policy, 1, now=0.0)
    eng.join(1, 100, 50)
    alone = eng.next_completion()
    assert alone is not None
    eng.rescale(0.0, 2.0)
    assert eng.next_completion() == pytest.approx(2 * alone)
    # Half-way through at double cost, back to full speed: the rest takes its own time.
    half = eng.steps_time(25)
    eng.rescale(half, 1.0)
    assert eng.s == 25
    assert eng.next_completion() == pytest.approx(half + eng.steps_time(25))
    eng.stall(half, 1.0)
    eng.rescale(half, 3.0)  # a stall under way stretches too
    assert eng.t0 == pytest.approx(half + 3.0)


def test_the_calibration_run_generates_the_real_graphs_lengths() -> None:
    w = load_workload(CPU)
    res = simulate(w, "static", Split(1, 1, 1), steps=2)
    r = w.response
    want = sum(budget_length(i, r.median, r.p99_over_median, r.cap) for i in range(128))
    assert res.tokens_generated == want  # sample ids 0..127, as graphs/grpo_genrm_longtail.py
    assert [rec["samples"] for rec in res.records] == [64, 64]


def test_sharing_one_core_among_three_workers_costs_time() -> None:
    w = load_workload(CPU)

    def on(cores: int) -> Workload:
        return dataclasses.replace(w, hardware=dataclasses.replace(w.hardware, cores=cores))

    one = simulate(on(1), "static", Split(1, 1, 1), steps=3)
    own = simulate(on(0), "static", Split(1, 1, 1), steps=3)
    three = simulate(on(3), "static", Split(1, 1, 1), steps=3)
    assert one.tokens_generated == own.tokens_generated
    assert one.sim_s > own.sim_s * 1.1  # rollout and judge overlap on one core
    assert three.sim_s == own.sim_s  # a core each: nobody waits


def test_data_parallel_steps_use_the_measured_figure() -> None:
    cost = CostModel(load_workload(CPU))
    m = cost.wl.policy.measured
    assert cost.train_world_s(1000, 3, True, False) == pytest.approx(
        m["train_per_token_s_world3"] * 1000)
    assert cost.train_world_s(1000, 3, True, True) == pytest.approx(
        m["train_per_token_s_world3"] * 1000 + m["train_regroup_s_world3"])
    assert cost.train_world_s(1000, 2, False, False) == pytest.approx(
        m["train_no_signal_per_token_s_world2"] * 1000)
    assert cost.train_world_s(1000, 4, True, True) is None  # not measured: the per-token model
    assert cost.train_s(1000, 10, 1, signal=False) == pytest.approx(
        m["train_no_signal_per_token_s"] * 1000)


def test_padded_prefill_charges_the_longest_prompt() -> None:
    # the calibration files' sittings ran the engine that prefilled every joiner in one pass
    cost = CostModel(load_workload(CPU))
    j = cost.wl.judge
    per = j.measured["prefill_per_padded_token_s"]
    assert j.measured["prefill_one_pass"] == 1
    assert cost.prefill_batch_s(j, [10, 200, 30]) == pytest.approx(
        j.measured["prefill_base_s"] + per * 3 * 200)


def test_prefill_is_charged_in_the_engines_passes_of_similar_length() -> None:
    # today's engine (pivotflow/batching.py): 10 and 30 in one pass padded to 30, 200 alone
    w = load_workload(CPU)
    j = w.judge
    measured = {k: v for k, v in j.measured.items() if k != "prefill_one_pass"}
    w = dataclasses.replace(w, judge=dataclasses.replace(j, measured=measured))
    cost = CostModel(w)
    base, per = measured["prefill_base_s"], measured["prefill_per_padded_token_s"]
    assert cost.prefill_batch_s(w.judge, [10, 200, 30]) == pytest.approx(
        2 * base + per * (2 * 30 + 200))


def test_backpressure_does_not_thrash_when_steps_may_lag() -> None:
    # max_staleness 2 on 3 workers for 3 pools: enough samples were ready for a step that could
    # not start (an older group still generating), trainers were lent for it and moved out
    # again every interval (319 shifts in one step), and two pools traded their one worker
    w = dataclasses.replace(load_workload(CPU), max_staleness=2)
    res = simulate(w, "backpressure", Split(1, 1, 1), steps=8)
    assert max(len(r["shift_events"]) for r in res.records) <= 30
    assert len(res.shifts) <= 8 * 20


def test_the_fluid_bound_counts_shared_cores_and_measured_data_parallel() -> None:
    from pivotflow.sim.fluid import fluid_bound, role_rates, signal_chance

    w = load_workload(CPU)
    own = dataclasses.replace(w, hardware=dataclasses.replace(w.hardware, cores=0))
    assert fluid_bound(w)["work_bound"] == pytest.approx(fluid_bound(own)["work_bound"] * 2 / 3)
    # p_yes 0.0195, 8 groups of 8: most steps have some signal, not all
    assert 0.5 < signal_chance(w) < 0.9
    linear = dict(w.policy.measured)
    for k in [k for k in linear if "_world" in k]:
        del linear[k]
    lin = dataclasses.replace(w, policy=dataclasses.replace(w.policy, measured=linear))
    # three trainers measured at 1.15x one, not 3x: the step's training takes longer
    assert role_rates(w).critical_path_s > role_rates(lin).critical_path_s + 0.05


def test_the_work_bound_mixes_step_widths_where_data_parallel_is_measured() -> None:
    from pivotflow.sim.fluid import data_parallel_work_bound, fluid_bound, role_rates

    w2 = dataclasses.replace(load_workload(CPU_W2), max_staleness=1)  # 2 workers, 2 cores
    r = role_rates(w2)
    (width, step_s), = r.dp_step_s  # 2 trainers measured, about 1.3x one
    a, t1, t2 = 1 / r.rollout + 1 / r.genrm, 1 / r.trainer, step_s / w2.samples_per_step
    assert width == 2 and t2 < t1 < 2 * t2
    # brute force over the share f of samples trained on both workers: the trainers' time
    # against the two devices' time, the larger one bounds a sample's time
    best = min(max((1 - f) * t1 + f * t2, (a + (1 - f) * t1 + f * 2 * t2) / 2)
               for f in (i / 10_000 for i in range(10_001)))
    got = data_parallel_work_bound(w2, r)
    assert got == pytest.approx(1 / best, rel=1e-4)
    f = fluid_bound(w2)
    assert r.trainer < got < f["work_bound"]  # above one trainer, below linear data parallel
    assert f["samples_per_s"] == pytest.approx(got)
    # GPU cost model: data parallel is linear, and the bound is the plain work bound
    gpu = fluid_bound(load_workload(CPU.parent / "dense7b_judge7b.toml"))
    assert gpu["data_parallel_work_bound"] == pytest.approx(gpu["work_bound"])
