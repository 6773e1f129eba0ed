"""The backpressure planner: move a worker where it shortens the work in flight the most, when
the time it saves pays for the shift.

Model: generate pool ``i`` with ``n_i`` workers, each completing ``mu_i`` samples/s when busy,
still has ``R_i`` samples to process (queued at it, in flight at it, or upstream of it in
admitted work). On its own it needs ``T_i = R_i / (n_i mu_i)``; generation cannot finish before
``max_i T_i``. Training starts only when its batch is complete, so its time adds:
``T_t = R_t / (n_t mu_t)``, plus one shift when the trainer pool is empty (a worker must join
first). The bound is ``max_i T_i + T_t``. A worker that moves into a generate pool works there
only after the shift ``c``: with ``k`` such joiners ``T_i = (R_i + k mu_i c) / (n_i mu_i)`` (the
shift costs the joiner's time, not the whole pool's). A move from ``s`` to ``d`` is made only when
it lowers the bound, joiners' shifts included, by more than ``hysteresis * shift_cost`` and the
worker has not moved within ``cooldown`` shift-costs; several moves may be made in one interval,
greedily, each paying.
One rule comes first: a pool with work waiting at it and no worker at all gets one at once (the
cost is unavoidable then).
"""

from __future__ import annotations

import math

from pivotflow.planner.base import Move, PlannerView, PoolView


def drain_time(pool: PoolView, workers: int, joiners: int = 0, delay_s: float = 0.0) -> float:
    """Seconds pool needs for its remaining samples with ``workers`` workers, ``joiners`` of
    which start only after ``delay_s`` (a shift): ``(R + k mu c) / (n mu)``, or what the others
    take alone if that is sooner (the work is gone before the joiners arrive)."""
    if pool.remaining == 0:
        return 0.0
    rate = max(pool.per_worker_rate, 1e-9)
    here = workers - joiners
    alone = pool.remaining / (here * rate) if here > 0 else math.inf
    if joiners <= 0:
        return alone
    return min(alone, (pool.remaining + joiners * rate * delay_s) / (workers * rate))


def train_time(view: PlannerView, pool: PoolView, workers: int, joining: bool = False) -> float:
    """Seconds of the next optimizer step with ``workers`` trainers now: the step may also use
    more workers, moved in when the batch is ready (idle generate workers then), for one shift;
    an empty pool, or one some of whose ``workers`` are ``joining`` now (a step waits for every
    trainer), must take at least that one shift."""
    if pool.remaining == 0:
        return 0.0
    total = sum(p.workers for p in view.pools.values())
    wait = view.shift_cost_s if workers == 0 or joining else 0.0
    best = drain_time(pool, max(workers, 1)) + wait
    if total > workers:  # drain time falls with every worker: of the larger pools, all is best
        best = min(best, drain_time(pool, total) + view.shift_cost_s)
    return best


def gen_bound(view: PlannerView, sizes: dict[str, int],
              joiners: dict[str, int] | None = None) -> float:
    """``max_i T_i`` over the generate pools, in pipeline order (``joiners``: workers of
    ``sizes`` that are moving in now). A downstream pool may be empty while nothing waits at
    it: its work is then done after the pools upstream drain, by a worker that moves in for one
    shift (what colocated does for every pool)."""
    bound = upstream = 0.0
    joiners = joiners or {}
    for name, p in view.pools.items():
        if p.role == "train":
            continue
        t = drain_time(p, sizes[name], joiners.get(name, 0), view.shift_cost_s)
        if sizes[name] == 0 and p.remaining and not p.queued and upstream > 0:
            t = upstream + view.shift_cost_s + drain_time(p, 1)
        bound = max(bound, t)
        upstream = max(upstream, t)
    return bound


def makespan(view: PlannerView, sizes: dict[str, int],
             joiners: dict[str, int] | None = None) -> float:
    """The bound above for pool sizes ``sizes`` (``joiners`` of them moving in now)."""
    gen = gen_bound(view, sizes, joiners)
    joiners = joiners or {}
    return gen + sum(train_time(view, p, sizes[n], joiners.get(n, 0) > 0)
                     for n, p in view.pools.items() if p.role == "train")


SHIFT_DECISIONS = 50  # decisions per shift duration at most


class BackpressurePlanner:
    name = "backpressure"

    def __init__(self, interval_s: float = 0.02, hysteresis: float = 0.5,
                 cooldown_costs: float = 1.0) -> None:
        self.min_interval_s = interval_s
        self.interval_s = interval_s  # how long the controller waits for the next decide()
        self.hysteresis = hysteresis
        self.cooldown_costs = cooldown_costs

    def decide(self, view: PlannerView) -> list[Move]:
        """Moves for this interval: first a worker for a pool with work waiting and none, then
        greedily the best move while it pays (several workers can join a pool at once: a train
        step waits for every trainer that is loading, so they should arrive together)."""
        # No move takes effect sooner than a shift: deciding SHIFT_DECISIONS times per shift
        # is enough (at 128 GPUs, 3 s shifts: every 66 ms, not every 20 ms).
        self.interval_s = max(self.min_interval_s, view.shift_cost_s / SHIFT_DECISIONS)
        sizes = {n: p.workers for n, p in view.pools.items()}
        moves: list[Move] = []
        taken: set[str] = set()
        starved = self._feed_starved(view, sizes)
        if starved is not None:
            moves.append(starved)
            taken.add(starved.worker)
            sizes = moved(sizes, starved.from_pool, starved.to_pool)
        for move in self._size_trainers(view, sizes, taken):
            moves.append(move)
            taken.add(move.worker)
            sizes = moved(sizes, move.from_pool, move.to_pool)
        joiners: dict[str, int] = {}  # the moves of this interval, by destination
        for m in moves:
            joiners[m.to_pool] = joiners.get(m.to_pool, 0) + 1
        while True:
            move = self._best_move(view, sizes, taken, joiners)
            if move is None:
                return moves
            moves.append(move)
            taken.add(move.worker)
            sizes = moved(sizes, move.from_pool, move.to_pool)
            joiners[move.to_pool] = joiners.get(move.to_pool, 0) + 1

    def _movable(self, view: PlannerView, src: PoolView, taken: set[str]) -> str | None:
        """The last ready worker of ``src`` not moved yet and out of its cooldown."""
        cooldown = self.cooldown_costs * view.shift_cost_s
        return next((w for w in reversed(src.ready) if w not in taken
                     and view.now_s - view.last_shift_s.get(w, -math.inf) > cooldown), None)

    def _best_move(self, view: PlannerView, sizes: dict[str, int], taken: set[str],
                   joiners: dict[str, int]) -> Move | None:
        now = makespan(view, sizes, joiners)
        best: Move | None = None
        best_gain = view.shift_cost_s * self.hysteresis  # the shift itself is in ``after``
        for src in view.pools.values():
            if not src.measured:  # no move on a borrowed rate
                continue
            worker = self._movable(view, src, taken)
            if worker is None:
                continue
            for dst in view.pools.values():
                if dst.name == src.name or dst.remaining == 0 or not dst.measured:
                    continue
                after = makespan(view, moved(sizes, src.name, dst.name),
                                 {**joiners, dst.name: joiners.get(dst.name, 0) + 1})
                gain = now - after if after < math.inf else -math.inf
                if gain > best_gain:
                    best_gain = gain
                    best = Move(worker, src.name, dst.name,
                                f"bound {now:.3f}s -> {after:.3f}s, shift costs "
                                f"{view.shift_cost_s:.3f}s", numbers(view, src, dst, now, gain))
        return best

    def _size_trainers(self, view: PlannerView, sizes: dict[str, int],
                       taken: set[str]) -> list[Move]:
        """When a batch is ready for a step not started yet, grow the trainer pool: greedily
        take the worker whose pool misses it least, while the step plus the generation still
        to do (``gen_bound``) gets shorter by more than a shift with hysteresis. A running step
        cannot use late joiners, so this is the one moment to size it."""
        moves: list[Move] = []
        for dst in view.pools.values():
            if dst.role != "train" or dst.queued == 0 or dst.remaining == 0:
                continue
            def total(sz: dict[str, int], dst: PoolView = dst) -> float:
                return gen_bound(view, sz) + drain_time(dst, max(sz[dst.name], 1))
            while True:
                now = total(sizes)
                options = [(total(moved(sizes, src.name, dst.name)), src.name, w)
                           for src in view.pools.values() if src.name != dst.name
                           for w in src.ready[-1:] if w not in taken]
                if not options:
                    break
                after, src_name, worker = min(options)
                if now - after <= view.shift_cost_s * (1 + self.hysteresis):
                    break
                src = view.pools[src_name]
                moves.append(Move(worker, src_name, dst.name,
                                  f"batch ready: {sizes[dst.name] + 1} trainers, step and "
                                  f"generation left {now:.3f}s -> {after:.3f}s",
                                  numbers(view, src, dst, now, now - after)))
                taken.add(worker)
                sizes = moved(sizes, src_name, dst.name)
        return moves

    def _feed_starved(self, view: PlannerView, sizes: dict[str, int]) -> Move | None:
        """A worker for the first pool with work waiting and none, from the pool that misses
        it least (cooldown and hysteresis do not apply: the work cannot move otherwise)."""
        for dst in view.pools.values():
            if dst.queued == 0 or dst.workers > 0:
                continue
            options = [(makespan(view, moved(sizes, src.name, dst.name)), src.name, src.ready[-1])
                       for src in view.pools.values() if src.name != dst.name and src.ready]
            if not options:
                return None
            after, src_name, worker = min(options)
            src = view.pools[src_name]
            return Move(worker, src_name, dst.name,
                        f"{dst.name} has {dst.queued} samples waiting and no worker",
                        numbers(view, src, dst, makespan(view, sizes), 0.0))
        return None


def moved(sizes: dict[str, int], src: str, dst: str) -> dict[str, int]:
    after = dict(sizes)
    after[src] -= 1
    after[dst] += 1
    return after


def numbers(view: PlannerView, src: PoolView, dst: PoolView, now: float,
            gain: float) -> dict[str, float | None]:
    """What a decision is logged with (an infinite bound, a pool with work and no worker, is
    logged as None: JSON has no infinity)."""
    out: dict[str, float] = {"makespan_s": now, "gain_s": gain, "shift_cost_s": view.shift_cost_s,
            f"remaining_{src.name}": src.remaining, f"remaining_{dst.name}": dst.remaining,
            f"rate_{src.name}": src.per_worker_rate, f"rate_{dst.name}": dst.per_worker_rate}
    return {k: (v if math.isfinite(v) else None) for k, v in out.items()}
