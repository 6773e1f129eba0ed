"""Edges: the queue in front of a model stage, measured for the planner and the live view."""

from __future__ import annotations

from collections import deque

from pivotflow.controller.sample import Sample
from pivotflow.metrics import Rate


class Edge:
    """A FIFO of samples waiting for a stage, with depth, arrival/service rates and wait time.

    Its bound is enforced upstream: the source admits a new group only while the number of groups
    in flight is under the admission quota, so backpressure reaches the source and no edge ever
    holds more than quota x group_size samples.
    """

    def __init__(self, name: str, window_s: float = 10.0) -> None:
        self.name = name
        self._queue: deque[Sample] = deque()
        self.arrivals = Rate(window_s)
        self.services = Rate(window_s)
        self.wait_s_total = 0.0
        self.served = 0

    def __len__(self) -> int:
        return len(self._queue)

    def push(self, sample: Sample, now: float, *, front: bool = False) -> None:
        sample.enqueued_at = now
        if front:  # re-dispatch of an aborted or failed job keeps its place in line
            self._queue.appendleft(sample)
        else:
            self._queue.append(sample)
        self.arrivals.observe(now)

    def pop_many(self, n: int, now: float) -> list[Sample]:
        """The first ``n`` samples at once (one frame's worth: one rate update, not ``n``)."""
        queue = self._queue
        out = [queue.popleft() for _ in range(n)]
        self.services.observe(now, n)
        self.wait_s_total += n * now - sum(s.enqueued_at for s in out)
        self.served += n
        return out

    def take_group(self, group_id: int) -> list[Sample]:
        """Take out every queued sample of one group (a refused group, generated again)."""
        out = [s for s in self._queue if s.group_id == group_id]
        if out:
            self._queue = deque(s for s in self._queue if s.group_id != group_id)
        return out

    def samples(self) -> list[Sample]:
        return list(self._queue)

    def mean_wait_s(self) -> float:
        return self.wait_s_total / self.served if self.served else 0.0

    def stats(self, now: float) -> dict[str, float]:
        return {
            "depth": float(len(self._queue)),
            "arrival_rate": self.arrivals.rate(now),
            "service_rate": self.services.rate(now),
            "mean_wait_s": self.mean_wait_s(),
        }
