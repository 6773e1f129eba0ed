"""The backpressure planner's decisions from given measurements (no processes involved)."""

from __future__ import annotations

from dataclasses import replace

import pytest

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
    assert "bound 10.000s -> 5.000s" in move.reason


def test_no_move_when_the_gain_does_not_pay_for_the_shift() -> None:
    # judge 21 left: 1.05 s now; moving gives max(0.1/1..., 0.525) -> gain ~0.5 s < 2 s cost
    assert BackpressurePlanner().decide(view(2, 21, cost=2.0)) == []


def test_balanced_pools_stay() -> None:
    assert BackpressurePlanner().decide(view(200, 200)) == []


def test_cooldown_keeps_a_worker_that_just_moved() -> None:
    recent = {"w0": 99.9, "w1": 99.95}
    assert BackpressurePlanner().decide(view(2, 200, last=recent)) == []


def test_never_strands_work_waiting_at_a_pool() -> None:
    # moving the only judge away would leave 5 samples waiting at it with no worker
    v = PlannerView(now_s=0.0, pools={
        "rollout": PoolView("rollout", ["w0"], 1, 500, 10.0),
        "genrm": PoolView("genrm", ["w2"], 1, 505, 20.0, queued=5)}, shift_cost_s=0.1)
    assert BackpressurePlanner().decide(v) == []


def test_an_idle_downstream_worker_helps_upstream_and_comes_back_later() -> None:
    # nothing waits at the judge yet: its worker rolls out now, and a worker moves back to
    # judge once rollout drains (500/2/10 = 25 s, then 0.1 s shift + 500/200 s), which beats
    # 500/10 = 50 s of rollout on one worker
    v = PlannerView(now_s=0.0, pools={
        "rollout": PoolView("rollout", ["w0"], 1, 500, 10.0, queued=500),
        "genrm": PoolView("genrm", ["w2"], 1, 500, 200.0)}, shift_cost_s=0.1)
    [move] = BackpressurePlanner().decide(v)
    assert (move.from_pool, move.to_pool) == ("genrm", "rollout")


def test_static_never_moves() -> None:
    assert StaticPlanner().decide(view(2, 200)) == []


def pipeline(roll: tuple[int, int, int], judge: tuple[int, int, int],
             train: tuple[int, int, int], cost: float = 0.05) -> PlannerView:
    """(workers, remaining, queued) per pool; rates: rollout 10/s, judge 40/s, train 200/s."""
    def pool(name: str, spec: tuple[int, int, int], rate: float, role: str,
             first: int) -> PoolView:
        n, remaining, queued = spec
        return PoolView(name, [f"w{first + i}" for i in range(n)], n, remaining, rate, role,
                        queued)
    return PlannerView(now_s=50.0, pools={
        "rollout": pool("rollout", roll, 10.0, "generate", 0),
        "genrm": pool("genrm", judge, 40.0, "generate", 10),
        "trainer": pool("trainer", train, 200.0, "train", 20)}, shift_cost_s=cost)


def test_an_idle_trainer_moves_to_rollout_while_the_batch_is_far() -> None:
    # 64 samples to roll out on 1 worker (6.4 s); the trainer would wait for them anyway
    [move] = BackpressurePlanner().decide(pipeline((1, 64, 64), (1, 64, 0), (1, 64, 0)))
    # generation bounds the step: 6.4 s on one rollout worker, 3.2 s on two; the train step
    # (3 trainers moved in when the batch is ready: 0.107 + 0.05 s) costs the same either way
    assert (move.from_pool, move.to_pool) == ("trainer", "rollout")
    assert move.numbers["gain_s"] == pytest.approx(3.2)


def test_a_ready_batch_with_no_trainer_gets_one_at_once() -> None:
    # generation is done; the batch waits and the trainer pool is empty
    moves = BackpressurePlanner().decide(pipeline((2, 0, 0), (1, 0, 0), (0, 64, 64)))
    assert moves[0].to_pool == "trainer" and "no worker" in moves[0].reason
    # and the idle workers join in the same breath: they load side by side, so the step
    # waits one shift for all of them (3 trainers: 0.107 + 0.05 s, against 0.32 + 0.05 s
    # alone), though the third alone saves only 0.053 s, less than a shift
    assert [m.to_pool for m in moves] == ["trainer"] * 3
    assert "batch ready: 2 trainers" in moves[1].reason
    assert "batch ready: 3 trainers" in moves[2].reason
    assert all(m.reason.endswith("0.370s -> 0.157s") for m in moves[1:])


def tail_view(busy_share: float) -> PlannerView:
    """A ready 10 s step on 16 trainers (5 samples/s each, shifts cost 1 s); the rollout in its
    tail (40 sequences on 8 workers of 64 slots: packed at an eighth, 5 workers hold them),
    the judge with 90 samples to come; the trainer pool stepped ``busy_share`` of the time."""
    view = pipeline((8, 40, 40), (8, 90, 10), (16, 1600, 800), cost=1.0)
    pools = dict(view.pools)
    pools["rollout"] = replace(pools["rollout"], inflight=40, slots=64)
    pools["genrm"] = replace(pools["genrm"], inflight=10, slots=64)
    pools["trainer"] = replace(pools["trainer"], per_worker_rate=5.0, batch=800,
                               busy_share=busy_share)
    return replace(view, pools=pools)


def test_a_step_is_lent_workers_together_when_one_alone_would_not_pay() -> None:
    # one more trainer saves 10 - 800/85 = 0.59 s, less than the 1.5 s a move must save;
    # several together (they load side by side, the step waits one shift) save seconds
    moves = BackpressurePlanner().decide(tail_view(busy_share=0.2))
    lent = [m for m in moves if "batch ready" in m.reason]
    assert len(lent) > 2 and all(m.to_pool == "trainer" for m in lent)
    # a step that ran a fifth of the time is not what the run waits for: the rollout's
    # tail is not packed to lend (it would slow every sequence in it); the judge lends
    assert {m.from_pool for m in lent} == {"genrm"}


def test_a_tail_is_packed_to_lend_only_while_the_steps_are_the_bottleneck() -> None:
    lent = [m for m in BackpressurePlanner().decide(tail_view(busy_share=0.6))
            if "batch ready" in m.reason]
    from_rollout = [m for m in lent if m.from_pool == "rollout"]
    # packed to 5 workers (40 sequences at an eighth of 64 slots), never below
    assert 0 < len(from_rollout) <= 3


def test_workers_lent_to_a_step_go_back_where_they_came_from_when_it_is_over() -> None:
    planner = BackpressurePlanner()
    # a batch is ready: idle generate workers join the trainer for this step
    lent = planner.decide(pipeline((2, 0, 0), (1, 0, 0), (1, 64, 64)))
    assert lent and all(m.to_pool == "trainer" and "batch ready" in m.reason for m in lent)
    # the step ran and is over (nothing queued at the trainer): each goes back, to its own pool
    sizes = {"rollout": 2, "genrm": 1}
    for m in lent:
        sizes[m.from_pool] -= 1
    ids = {"rollout": [f"w{i}" for i in range(2)], "genrm": ["w10"]}
    home = {m.worker: m.from_pool for m in lent}
    after = PlannerView(now_s=60.0, pools={
        "rollout": PoolView("rollout", [w for w in ids["rollout"] if w not in home],
                            sizes["rollout"], 64, 10.0, "generate", 64),
        "genrm": PoolView("genrm", [w for w in ids["genrm"] if w not in home], sizes["genrm"],
                          64, 40.0, "generate", 0),
        "trainer": PoolView("trainer", ["w20", *home], 1 + len(home), 64, 200.0, "train", 0)},
        shift_cost_s=0.05)
    back = [m for m in planner.decide(after) if "step over" in m.reason]
    assert {(m.worker, m.to_pool) for m in back} == set(home.items())
    assert all(m.from_pool == "trainer" for m in back)
    assert not planner.lent  # nothing is owed any more


def test_no_worker_is_moved_twice_when_returns_and_a_starved_pool_meet() -> None:
    # two workers lent to the step that just ended, every worker in the trainer pool, work
    # waiting at an empty rollout: they go back, and nothing else takes one of them as well
    planner = BackpressurePlanner()
    planner.lent.update({"w0": "rollout", "w2": "rollout"})
    v = pipeline((0, 64, 64), (0, 64, 0), (3, 64, 0))
    v.pools["trainer"] = PoolView("trainer", ["w1", "w2", "w0"], 3, 64, 200.0, "train", 0)
    moves = planner.decide(v)
    assert len({m.worker for m in moves}) == len(moves)
    assert {(m.worker, m.to_pool) for m in moves if "step over" in m.reason} == {
        ("w0", "rollout"), ("w2", "rollout")}
    assert not any("no worker" in m.reason and m.to_pool == "rollout" for m in moves)


def test_no_move_on_a_rate_that_was_never_measured() -> None:
    v = pipeline((1, 64, 64), (1, 64, 0), (1, 64, 0))
    v.pools["trainer"] = PoolView("trainer", ["w20"], 1, 64, 10.0, "train", 0, measured=False)
    assert all(m.from_pool != "trainer" for m in BackpressurePlanner().decide(v))


def test_trainers_are_not_sized_on_borrowed_rates() -> None:
    # the first step's batch is ready and no rate is measured yet (the trainer's borrowed one
    # makes a step look long): the one trainer trains it, nobody is pulled in
    v = pipeline((2, 0, 0), (1, 0, 0), (1, 64, 64))
    measured = BackpressurePlanner().decide(v)
    assert any("batch ready" in m.reason for m in measured)
    borrowed = PlannerView(now_s=v.now_s, shift_cost_s=v.shift_cost_s, pools={
        n: replace(p, measured=False) for n, p in v.pools.items()})
    assert BackpressurePlanner().decide(borrowed) == []


def test_a_ready_step_keeps_its_trainers() -> None:
    # the batch is ready and the rollout has 40 s of work on one worker: the bound says move
    # every trainer to the rollout, but the step would then start with none (and pull one
    # back next interval). It starts with its trainers; they may move when it is over.
    assert BackpressurePlanner().decide(pipeline((1, 400, 400), (1, 400, 200), (3, 64, 64))) \
        == []
    moves = BackpressurePlanner().decide(pipeline((1, 400, 400), (1, 400, 200), (3, 64, 0)))
    assert {m.from_pool for m in moves} == {"trainer"}  # no batch waiting: they go


def test_no_trainers_join_a_step_whose_batch_is_not_ready() -> None:
    moves = BackpressurePlanner().decide(pipeline((2, 0, 0), (1, 5, 5), (1, 64, 0)))
    assert all(m.to_pool != "trainer" for m in moves)


def test_colocated_moves_everyone_to_the_first_pool_with_work() -> None:
    from pivotflow.planner import ColocatedPlanner

    moves = ColocatedPlanner().decide(pipeline((1, 0, 0), (1, 64, 64), (1, 64, 0)))
    assert sorted((m.worker, m.to_pool) for m in moves) == [("w0", "genrm"), ("w20", "genrm")]
    # a pool still busy keeps its workers until its phase ends
    moves = ColocatedPlanner().decide(pipeline((1, 5, 5), (1, 64, 20), (1, 64, 0)))
    assert [(m.worker, m.to_pool) for m in moves] == [("w20", "rollout")]
    assert ColocatedPlanner().decide(pipeline((0, 0, 0), (0, 0, 0), (3, 64, 64))) == []


def test_a_colocate_group_phases_its_own_workers_and_keeps_them() -> None:
    from pivotflow.planner import make_planner

    # static, rollout+genrm time-share the inference workers; the trainer is its own part
    planner = make_planner("static", [("rollout", "genrm"), ("trainer",)])
    assert planner.name == "static"
    # judging waits and rollout is done: the group's rollout worker judges; the idle trainer,
    # in a group of its own, never leaves it (colocated would send it to the judge too)
    moves = planner.decide(pipeline((1, 0, 0), (0, 64, 64), (1, 64, 0)))
    assert [(m.worker, m.from_pool, m.to_pool) for m in moves] == [("w0", "rollout", "genrm")]
    # rollout has work again: back, while the trainer trains
    moves = planner.decide(pipeline((0, 64, 64), (1, 0, 0), (1, 64, 64)))
    assert [(m.worker, m.to_pool) for m in moves] == [("w10", "rollout")]
    # a group of one pool is a plain static split: no colocate group, no moves ever
    assert type(make_planner("static", [("rollout",), ("genrm",), ("trainer",)])).__name__ \
        == "StaticPlanner"


def test_a_last_worker_takes_turns_instead_of_trading_every_interval() -> None:
    # rollout has work waiting and no worker; the judge's only worker moved in 0.1 s ago and
    # has work of its own: it stays until it has served 10 shift costs there, then goes
    def at(now: float) -> PlannerView:
        return PlannerView(now_s=now, pools={
            "rollout": PoolView("rollout", [], 0, 60, 10.0, queued=60),
            "genrm": PoolView("genrm", ["w2"], 1, 70, 40.0, queued=10),
            "trainer": PoolView("trainer", [], 1, 64, 200.0, "train", 0)},
            shift_cost_s=0.02, last_shift_s={"w2": 10.0})
    assert BackpressurePlanner().decide(at(10.1)) == []
    [move] = BackpressurePlanner().decide(at(10.3))
    assert (move.worker, move.to_pool) == ("w2", "rollout")
    assert "rollout has 60 samples waiting and no worker" in move.reason


def test_trainers_are_sized_on_the_measured_data_parallel_rate() -> None:
    # a ready batch of 64: one trainer does 100 samples/s; two were measured at 120/s (not
    # 200): a second trainer saves 0.64 - 0.53 = 0.11 s, more than the shift with hysteresis
    # (0.05 * 1.5 = 0.075), so it moves; at 105/s it would save 0.03 s and stays
    def ready(two: float) -> PlannerView:
        return PlannerView(now_s=50.0, pools={
            "rollout": PoolView("rollout", ["w0"], 1, 0, 10.0),
            "trainer": PoolView("trainer", ["w20"], 1, 64, 100.0, "train", 64,
                                rate_by_size=((1, 100.0), (2, two)))}, shift_cost_s=0.05)
    [move] = BackpressurePlanner().decide(ready(120.0))
    assert (move.from_pool, move.to_pool) == ("rollout", "trainer")
    assert BackpressurePlanner().decide(ready(105.0)) == []


def test_pool_rate_uses_the_sizes_measured() -> None:
    from pivotflow.planner.backpressure import pool_rate

    p = PoolView("trainer", [], 1, 64, 50.0, "train", rate_by_size=((1, 100.0), (3, 150.0)))
    assert pool_rate(p, 3) == 150.0
    assert pool_rate(p, 4) == pytest.approx(200.0)  # past the largest: linear from it
    assert pool_rate(p, 2) == pytest.approx(125.0)  # between 1 and 3: interpolated
    assert pool_rate(PoolView("g", [], 2, 5, 10.0), 3) == 30.0  # nothing by size: per worker


def test_a_rollout_tail_lets_go_workers_that_only_thin_its_batches() -> None:
    # 40 sequences in flight on 4 rollout workers of 512 slots each: the tail. On the linear
    # model a second worker leaving would stretch rollout 10 s -> 20 s; but the 40 fit one
    # worker at TAIL_FILL of its slots and run one token a step wherever they are, so rollout
    # stays 10 s, and the judge's 22 s -> 7.3 s: two move (a third gains nothing).
    def v(inflight: int) -> PlannerView:
        return PlannerView(now_s=100.0, pools={
            "rollout": PoolView("rollout", ["w0", "w1", "w2", "w3"], 4, 40, 1.0, queued=40,
                                inflight=inflight, slots=512),
            "genrm": PoolView("genrm", ["w4"], 1, 440, 20.0, queued=400)}, shift_cost_s=0.1)
    tail = BackpressurePlanner().decide(v(40))
    assert [(m.from_pool, m.to_pool) for m in tail] == [("rollout", "genrm")] * 2
    # 10 of them still wait for a slot: not a tail, every worker counts
    waiting = BackpressurePlanner().decide(v(30))
    assert [(m.from_pool, m.to_pool) for m in waiting] == [("rollout", "genrm")]


def test_tail_workers_counts_the_workers_a_tail_needs() -> None:
    from pivotflow.planner.backpressure import TAIL_FILL, drain_time, tail_workers

    per_worker = int(64 * TAIL_FILL)
    pool = PoolView("rollout", ["w0", "w1", "w2", "w3"], 4, 2 * per_worker, 1.0,
                    queued=2 * per_worker, inflight=2 * per_worker, slots=64)
    assert tail_workers(pool) == 2
    assert drain_time(pool, 2) == drain_time(pool, 4) == pytest.approx(2 * per_worker / 4)
    assert drain_time(pool, 1) == pytest.approx(2 * drain_time(pool, 2))
    # no slots known, or work still upstream of the pool: not a tail
    assert tail_workers(PoolView("rollout", [], 4, 10, 1.0, queued=10, inflight=10)) == 0
    assert tail_workers(PoolView("rollout", [], 4, 20, 1.0, queued=10, inflight=10,
                                 slots=64)) == 0


def test_a_block_of_workers_moves_where_one_alone_saves_less_than_a_shift(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pivotflow.planner import backpressure

    # 200 workers: rollout 12000 samples on 120 (100 s), the judge 12000 on 80 (75 s). One
    # judge worker more at rollout saves 0.83 s, less than the 1.5 s a move must; a block of
    # 2% of the cluster (4) load side by side for one shift and save 3.2 s
    v = PlannerView(now_s=100.0, pools={
        "rollout": PoolView("rollout", [f"r{i}" for i in range(120)], 120, 12000, 1.0,
                            queued=12000),
        "genrm": PoolView("genrm", [f"j{i}" for i in range(80)], 80, 12000, 2.0)},
        shift_cost_s=1.0)
    monkeypatch.setattr(backpressure, "BLOCK_SHARE", 0.0)  # one worker at a time
    assert BackpressurePlanner().decide(v) == []
    monkeypatch.setattr(backpressure, "BLOCK_SHARE", 0.02)
    moves = BackpressurePlanner().decide(v)
    assert {(m.from_pool, m.to_pool) for m in moves} == {("genrm", "rollout")}
    # blocks of 4 up to the balance (12000/n = 6000/(200 - n) at n = 133): 132 at rollout
    assert len(moves) == 12 and len({m.worker for m in moves}) == 12


def test_stand_ins_for_lent_workers_go_home_with_them() -> None:
    # a step runs on a judge worker lent to it (w12); the judge, left with one worker, has a
    # backlog, and idle rollout workers stand in for w12 meanwhile
    planner = BackpressurePlanner()
    planner.lent["w12"] = "genrm"
    during = PlannerView(now_s=50.0, pools={
        "rollout": PoolView("rollout", ["w0", "w1", "w2", "w3"], 4, 40, 10.0, queued=40),
        "genrm": PoolView("genrm", ["w10"], 1, 440, 40.0, queued=400),
        "trainer": PoolView("trainer", [], 2, 64, 200.0, "train", 64, batch=64,
                            step_running=True)}, shift_cost_s=0.05)
    stand = planner.decide(during)
    assert [(m.worker, m.to_pool) for m in stand] == [("w3", "genrm"), ("w2", "genrm")]
    # the step is over: w12 goes back to the judge, and its stand-ins back to rollout
    after = PlannerView(now_s=60.0, pools={
        "rollout": PoolView("rollout", ["w0", "w1"], 2, 20, 10.0, queued=20),
        "genrm": PoolView("genrm", ["w10", "w3", "w2"], 3, 60, 40.0, queued=40),
        "trainer": PoolView("trainer", ["w20", "w12"], 2, 64, 200.0, "train", 0, batch=64)},
        shift_cost_s=0.05)
    back = planner.decide(after)
    assert {(m.worker, m.to_pool) for m in back} >= {
        ("w12", "genrm"), ("w3", "rollout"), ("w2", "rollout")}
    assert not planner.lent and not planner.stand_ins


@pytest.mark.parametrize("lender, busy_share, gives", [
    (True, 0.2, False), (True, 0.6, True), (False, 0.2, True)])
def test_a_tail_stands_in_for_lent_workers_only_while_the_steps_are_the_bottleneck(
        lender: bool, busy_share: float, gives: bool) -> None:
    # the rollout tail of test_a_rollout_tail_lets_go_workers_that_only_thin_its_batches and a
    # judge with a backlog. While judge workers are lent to a step, rollout workers moved in
    # would only stand in for them until they are back: packing the tail for that slows each of
    # its sequences, which pays only when the steps are what the run waits for (a trainer
    # pool stepping ``busy_share`` of the time). A judge that lent none gets them whatever
    # the steps' share.
    planner = BackpressurePlanner()
    if lender:
        planner.lent["w9"] = "genrm"
    v = PlannerView(now_s=100.0, pools={
        "rollout": PoolView("rollout", ["w0", "w1", "w2", "w3"], 4, 40, 1.0, queued=40,
                            inflight=40, slots=512),
        "genrm": PoolView("genrm", ["w4"], 1, 440, 20.0, queued=400),
        "trainer": PoolView("trainer", [], 2, 440, 200.0, "train", 64, batch=64,
                            step_running=True, busy_share=busy_share)},
        shift_cost_s=0.1)
    moves = planner.decide(v)
    assert any(m.from_pool == "rollout" for m in moves) is gives
