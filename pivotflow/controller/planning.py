"""What the controller measures for its planner: per pool, the work still to pass it, the work
at it now, its per-worker service rate, the workers that can move, and the measured cost of a
shift.

The view is built every planner interval (20 times a virtual second in the simulator, with
hundreds of workers), so each part is one pass over what it reads, and the per-worker time of
the last shift is kept up to date incrementally; the numbers are exactly those of the plain
definitions in the docstrings (same values, same order of floating-point additions).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from pivotflow.planner.base import PlannerView, PoolView

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller


SHIFT_COST_PRIOR_S = 0.1  # until the first shift is measured
SHIFT_COST_WINDOW = 8  # the shift cost is the mean of this many last shifts


def _movable(ctl: Controller, pool: str) -> list[str]:
    workers, active = ctl.workers, ctl.shifts.active
    return [w for w in ctl.pools[pool].workers
            if (h := workers[w]).state == "ready" and not h.training and w not in active]


def _shift_cost(ctl: Controller) -> float:
    """Mean ``total_s`` of the last ``SHIFT_COST_WINDOW`` finished shifts that have one."""
    recent: list[float] = []
    for r in reversed(ctl.shifts.done):
        if r.total_s is not None:
            recent.append(r.total_s)
            if len(recent) == SHIFT_COST_WINDOW:
                break
    if not recent:
        # Start-up loads overstate a shift (imports, every worker at once), so they only raise
        # the prior: a move must not assume 0.1 s where loading a role took seconds (128
        # simulated GPUs: 3.3 s; moves at 0.1 s made 364 shifts in 6 steps)
        loads = sorted(ctl.shifts.first_loads)
        return max(SHIFT_COST_PRIOR_S, loads[len(loads) // 2] if loads else 0.0)
    recent.reverse()  # add in the order of the records, as a plain sum over them would
    return sum(recent) / len(recent)


def _train_rates(ctl: Controller, running: int) -> tuple[tuple[int, float], ...]:
    """The trainer pool's samples/s per number of trainers: each size's measured tokens/s
    over the tokens per sample of the work in question (the step running, else the samples
    ready, else the last step's). Kept in samples/s, the rates of sizes last measured on
    shorter samples stayed as fast as then: in a drift to 4x longer responses (simulated
    dense7b+32b, 128 GPUs, seed 2) a size measured early read 3x the late sizes', the curve
    ran backwards, and the run's last step trained on 14 trainers for 215 s with 50 idle
    workers beside it."""
    t = ctl.training
    if running:
        per_sample = t.batch_tokens / running
    elif ctl.train_buffer.ready_samples:
        per_sample = ctl.train_buffer.ready_tokens / ctl.train_buffer.ready_samples
    else:
        per_sample = t.last_tokens_per_sample
    if per_sample <= 0:
        return ()
    return tuple((n, tokens / secs / per_sample) for n, (tokens, secs) in sorted(t.by_size.items())
                 if secs > 0)


def planner_view(ctl: Controller) -> PlannerView:
    """``remaining`` counts samples queued or in flight at the pool's stage or any model stage
    before it (for the trainer pool: admitted samples not trained nor in the step running); a
    pool that has not served yet borrows the slowest measured rate, and before the first optimizer
    step no rate counts as measured (``measured=False``); the shift cost is the mean
    of the last 8 shifts (``SHIFT_COST_PRIOR_S`` before the first)."""
    now = ctl.clock.now()
    jobs = ctl.jobs
    busy_now = jobs.busy_now(now)
    pools: dict[str, PoolView] = {}
    upstream = 0
    for idx in sorted(ctl.edges):
        pool = ctl.pools[ctl.order[idx].pool or ""]
        here = len(ctl.edges[idx]) + jobs.inflight[idx]
        upstream += here
        slots = max((ctl.workers[w].capacity for w in pool.workers), default=0)
        pools[pool.name] = PoolView(pool.name, _movable(ctl, pool.name), len(pool.workers),
                                    upstream, jobs.rate(pool.name, busy_now), "generate", here,
                                    inflight=jobs.inflight[idx], slots=slots,
                                    done=jobs.pool_done[pool.name],
                                    busy_s=jobs.busy(pool.name, busy_now))
    # The trainer pool: a step in flight cannot use workers that join now, so its work counts
    # only what is still to come; ``queued`` is a complete batch waiting, or the step running.
    tpool = ctl.training.pool
    size = ctl.source.group_size
    ready = ctl.train_buffer.ready_samples
    untrained = len(ctl.train_buffer.open) * size
    batch = ctl.source.groups_per_step * size
    # A batch counts as waiting only when the step can take it: with max_staleness > 0 enough
    # samples may be ready while an older group that must be in this step still generates,
    # and trainers lent for it would sit idle (then move out and back each interval).
    queued = ready if ready >= batch and ctl.train_buffer.can_take(ctl.version) else 0
    running = ctl.training.batch_samples  # == len(ctl.training.samples())
    by_size = _train_rates(ctl, running)
    pools[tpool] = PoolView(tpool, _movable(ctl, tpool), len(ctl.pools[tpool].workers),
                            untrained, jobs.rate(tpool, busy_now), "train", running or queued,
                            rate_by_size=by_size, batch=batch, step_running=running > 0,
                            busy_share=ctl.training.busy_share(now),
                            done=jobs.pool_done[tpool], busy_s=jobs.busy(tpool, busy_now))
    rates = [p.per_worker_rate for p in pools.values() if p.per_worker_rate > 0]
    # Before the first optimizer step no rate counts as measured: on a long tail only the short
    # sequences have finished, so completions per busy second read far too low (bounds of 1e5
    # s at 128 simulated GPUs moved a third of the rollout away at t = 10 s).
    first_step = ctl.version == 0
    for name, p in pools.items():  # a pool that has not served yet borrows a rate, if any
        if p.per_worker_rate == 0 or first_step:
            borrowed = p.per_worker_rate or (min(rates) if rates else 0.0)
            pools[name] = replace(p, per_worker_rate=borrowed, measured=False)
    return PlannerView(now, pools, _shift_cost(ctl), ctl.shifts.last_started(), ctl.version)
