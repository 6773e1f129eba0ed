"""Reasoning-length responses for the tiny tasks: a per-sample length budget.

Reasoning RL's response lengths are log-normal with a long tail (p99 about 10x the median).
``length_budget`` makes a map stage that draws each sample's length from that distribution,
seeded by the sample id (so every planner, and the simulator, sees the same lengths), and
forces the rollout to generate exactly that many tokens (``min_tokens = max_tokens``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

Z99 = 2.3263  # the standard normal's 99th percentile


def budget_length(sample_id: int, median: float, p99_ratio: float, cap: int) -> int:
    """Sample ``sample_id``'s response length: log-normal(median, sigma), at least 1, capped."""
    sigma = math.log(p99_ratio) / Z99
    n = random.Random(sample_id).lognormvariate(math.log(median), sigma)
    return max(1, min(cap, round(n)))


def length_budget(median: float, p99_ratio: float,
                  cap: int) -> Callable[..., dict[str, int]]:
    """A map stage writing ``min_tokens`` and ``max_tokens`` for each sample."""

    def budget(sample_id: int, **_: object) -> dict[str, int]:
        """This sample's response length: log-normal(median, sigma), at least 1, capped."""
        n = budget_length(sample_id, median, p99_ratio, cap)
        return {"min_tokens": n, "max_tokens": n}

    return budget
