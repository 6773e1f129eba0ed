from __future__ import annotations

import pytest

from pivotflow.sim.cost_model import CostModel
from pivotflow.sim.sim_engine import SimBatchEngine
from pivotflow.sim.workload import Workload


def brute_force(cost: CostModel, w: Workload, seqs: list[tuple[int, int]]) -> list[float]:
    """Completion times stepping token by token: seqs are (context, new tokens), all at t=0."""
    left = [n for _, n in seqs]
    ctx = [c for c, _ in seqs]
    t, done = 0.0, [0.0] * len(seqs)
    while any(x > 0 for x in left):
        live = [i for i, x in enumerate(left) if x > 0]
        k = cost.decode(w.policy, len(live))
        t += k.step_s(len(live), sum(ctx[i] for i in live))
        for i in live:
            left[i] -= 1
            ctx[i] += 1
            if left[i] == 0:
                done[i] = t
    return done


def test_event_driven_completions_match_token_by_token(tiny_workload: Workload) -> None:
    cost = CostModel(tiny_workload)
    seqs = [(100, 50), (300, 7), (20, 400), (1000, 50)]
    eng = SimBatchEngine(cost, tiny_workload.policy, 1, now=0.0)
    for i, (ctx, n) in enumerate(seqs):
        eng.join(i, ctx, n)
    got: dict[int, float] = {}
    while (when := eng.next_completion()) is not None:
        for seq in eng.pop_finished(when):
            got[seq.job_id] = when
    want = brute_force(cost, tiny_workload, seqs)
    assert [got[i] for i in range(len(seqs))] == pytest.approx(want, rel=1e-9)


def test_advance_counts_whole_steps_and_abort_returns_them(tiny_workload: Workload) -> None:
    cost = CostModel(tiny_workload)
    eng = SimBatchEngine(cost, tiny_workload.policy, 1, now=0.0)
    eng.join(1, 100, 1000)
    eng.join(2, 100, 1000)
    ten = eng.steps_time(10)
    eng.advance(ten + 0.5 * (eng.steps_time(11) - ten))  # mid-way through step 11
    assert eng.s == 10
    _, generated = eng.remove(1)  # type: ignore[misc]
    assert generated == 10
    assert eng.c_base + len(eng.seqs) * eng.s == 110  # the survivor's context


def test_stall_delays_completion(tiny_workload: Workload) -> None:
    cost = CostModel(tiny_workload)
    eng = SimBatchEngine(cost, tiny_workload.policy, 1, now=0.0)
    eng.stall(0.0, 2.0)
    eng.join(1, 10, 5)
    assert eng.next_completion() == pytest.approx(2.0 + eng.steps_time(5))


def test_moe_reads_fewer_weights_at_small_batch() -> None:
    from pathlib import Path

    from pivotflow.sim.workload import load_workload

    w = load_workload(Path(__file__).parents[2] / "bench/workloads/moe30b_judge30b.toml")
    cost = CostModel(w)
    one, many = cost.weights_read_bytes(w.policy, 1), cost.weights_read_bytes(w.policy, 256)
    assert one < 0.2 * w.policy.weight_bytes
    assert many == pytest.approx(w.policy.weight_bytes, rel=0.01)
