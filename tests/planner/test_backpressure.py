"""The backpressure planner's decisions from given measurements (no processes involved)."""

from __future__ import annotations

from pivotflow.planner import BackpressurePlanner, PlannerView, PoolView, StaticPlanner


def view(roll_remaining: int, judge_remaining: int, *, cost: float = 0.1,
         last: dict[str, float] | None = None) -> PlannerView:
    return PlannerView(
        now_s=100.0,
        pools={
            "rollout": PoolView("rollout", ["w0", "w1"], 2, roll_remaining, 10.0),
            "genrm": PoolView("genrm", ["w2"], 1, judge_remaining, 20.0),
        },
        shift_cost_s=cost, last_shift_s=last or {})


def test_moves_idle_rollout_worker_to_the_judge_backlog() -> None:
    # rollout: 2 samples left on 2 workers (0.1 s); judge: 200 left on 1 worker (10 s)
    [move] = BackpressurePlanner().decide(view(2, 200))
    assert (move.from_pool, move.to_pool) == ("rollout", "genrm")
    assert move.numbers["gain_s"] > 4.0  # 10 s -> 5 s bound
    assert "drain bound" in move.reason


def test_no_move_when_the_gain_does_not_pay_for_the_shift() -> None:
    # judge 21 left: 1.05 s now; moving gives max(0.1/1..., 0.525) -> gain ~0.5 s < 2 s cost
    assert BackpressurePlanner().decide(view(2, 21, cost=2.0)) == []


def test_balanced_pools_stay() -> None:
    assert BackpressurePlanner().decide(view(200, 200)) == []


def test_cooldown_keeps_a_worker_that_just_moved() -> None:
    recent = {"w0": 99.9, "w1": 99.95}
    assert BackpressurePlanner().decide(view(2, 200, last=recent)) == []


def test_never_strands_remaining_work() -> None:
    # moving the only judge away would leave judge work with no worker: infinite bound
    v = PlannerView(now_s=0.0, pools={
        "rollout": PoolView("rollout", ["w0"], 1, 500, 10.0),
        "genrm": PoolView("genrm", ["w2"], 1, 5, 20.0)}, shift_cost_s=0.1)
    assert BackpressurePlanner().decide(v) == []


def test_static_never_moves() -> None:
    assert StaticPlanner().decide(view(2, 200)) == []
