"""A simulated continuous-batching engine, advanced analytically from event to event.

No per-token events: between two events (a job joins, one finishes, an abort, a weight load)
the batch is fixed, so with ``B`` sequences and ``C(s) = C0 + B * s`` context tokens at step
``s`` the decode step time is linear in ``s`` and the time of ``n`` steps is a quadratic in
``n``: the next completion time is computed, and the steps done by any instant are its inverse.
A worker of ``r`` replicas is modelled as ``r`` replicas in lockstep, each holding ``1/r`` of
the batch. Joining jobs are prefilled first (a stall of every sequence, spread over replicas),
as are weight loads; a job that arrives mid-step joins at the step boundary before it.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from pivotflow.sim.cost_model import CostModel, DecodeCoeffs
from pivotflow.sim.workload import ModelSpec


@dataclass(slots=True)
class SimSeq:
    """One sequence in the batch: generates ``end - start`` tokens from step ``start``."""

    job_id: int
    start: int
    end: int
    ctx0: int  # prompt + prefix tokens when it joined


class SimBatchEngine:
    """The batch state of one generate worker; times are virtual seconds."""

    def __init__(self, cost: CostModel, model: ModelSpec, gpus: int, now: float) -> None:
        self.cost, self.model = cost, model
        self.r = cost.replicas(model, gpus)
        self.s = 0  # decode steps completed
        self.t0 = now  # when step ``s`` starts
        self.seqs: dict[int, SimSeq] = {}
        self._heap: list[tuple[int, int]] = []  # (end step, job id), stale entries skipped
        self.c_base = 0  # context tokens at step s are c_base + len(seqs) * s
        # A dense model's coefficients do not depend on the batch: computed once. An MoE's
        # weight reads do, so they are recomputed when the batch size changed since last use.
        self._fixed = None if model.moe else cost.decode(model, 1)
        self._coeffs_b = -1
        self._coeffs = cost.decode(model, 1)
        self.busy_s = 0.0  # time spent decoding or prefilling (for utilisation)
        self.slow = 1.0  # > 1 while busy workers outnumber shared cores (sim/cores.py)

    # ------------------------------------------------------------ time algebra

    def _k(self) -> DecodeCoeffs:
        """Step coefficients for the current batch (per replica)."""
        if self._fixed is not None:
            return self._fixed
        b = len(self.seqs)
        if b != self._coeffs_b:
            self._coeffs_b = b
            self._coeffs = self.cost.decode(self.model, max(b / self.r, 1.0))
        return self._coeffs

    def steps_time(self, n: int) -> float:
        """Seconds for the next ``n`` decode steps with the current batch."""
        b = len(self.seqs)
        k = self._k()
        first = k.base + k.per_seq * b / self.r + k.per_ctx * (self.c_base + b * self.s) / self.r
        return (n * first + k.per_ctx * b / self.r * n * (n - 1) / 2) * self.slow

    def _steps_within(self, dt: float) -> int:
        """Whole decode steps that fit in ``dt`` seconds (inverse of ``steps_time``)."""
        b = len(self.seqs)
        if dt <= 0 or b == 0:
            return 0
        dt /= self.slow
        k = self._k()
        first = k.base + k.per_seq * b / self.r + k.per_ctx * (self.c_base + b * self.s) / self.r
        a = k.per_ctx * b / self.r / 2
        lin = first - a
        n = dt / lin if a == 0 else (-lin + math.sqrt(lin * lin + 4 * a * dt)) / (2 * a)
        n = int(n + 1e-9)  # a boundary hit exactly may compute as n - tiny
        while n > 0 and self.steps_time(n) > dt * self.slow:  # float rounding at the boundary
            n -= 1
        return n

    def advance(self, now: float) -> None:
        """Move to the last step boundary at or before ``now`` (never past a completion)."""
        if not self.seqs:
            self.t0 = max(self.t0, now)
            return
        n = self._steps_within(now - self.t0)
        if self._heap:
            n = min(n, self._heap[0][0] - self.s)
        if n > 0:
            dt = self.steps_time(n)
            self.t0 += dt
            self.busy_s += dt
            self.s += n

    def stall(self, now: float, seconds: float) -> None:
        """Nothing decodes for ``seconds`` from ``now`` (prefill, weight load)."""
        self.advance(now)
        self.t0 = max(self.t0, now) + seconds * self.slow
        self.busy_s += seconds * self.slow

    def rescale(self, now: float, slow: float) -> None:
        """From ``now`` on, run ``slow`` times slower than alone (cores shared): the rest of a
        stall stretches with it; the step under way restarts at its last boundary."""
        self.advance(now)
        if self.t0 > now:
            self.t0 = now + (self.t0 - now) * slow / self.slow
        self.slow = slow

    # ------------------------------------------------------------ batch changes

    def join(self, job_id: int, ctx0: int, new_tokens: int) -> None:
        """Add a sequence (after ``advance``/``stall``) that will generate ``new_tokens``."""
        seq = SimSeq(job_id, self.s, self.s + max(1, new_tokens), ctx0)
        self.seqs[job_id] = seq
        self.c_base += ctx0 - self.s
        heapq.heappush(self._heap, (seq.end, job_id))

    def remove(self, job_id: int) -> tuple[SimSeq, int] | None:
        """Take a sequence out (after ``advance``); returns it with the tokens it generated."""
        seq = self.seqs.pop(job_id, None)
        if seq is None:
            return None
        self.c_base -= seq.ctx0 - seq.start
        return seq, self.s - seq.start

    def next_completion(self) -> float | None:
        """Virtual time of the next finished sequence, or None when the batch is empty."""
        while self._heap and self._heap[0][1] not in self.seqs:
            heapq.heappop(self._heap)
        if not self._heap:
            return None
        return self.t0 + self.steps_time(self._heap[0][0] - self.s)

    def pop_finished(self, when: float) -> list[SimSeq]:
        """At the completion time ``when``: step to it and take out every finished sequence."""
        end = self._heap[0][0]
        dt = self.steps_time(end - self.s)
        self.busy_s += dt
        self.t0, self.s = when, end
        done = []
        while self._heap and self._heap[0][0] <= self.s:
            _, job_id = heapq.heappop(self._heap)
            seq = self.seqs.get(job_id)
            if seq is not None and seq.end <= self.s:
                self.remove(job_id)
                done.append(seq)
        return done
