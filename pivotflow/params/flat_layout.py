"""How the sharded AdamW (``worker/sharded_adam.py``) cuts a model's trainable weights: one flat
index space, in parameter order, cut into buckets of at most ``bucket_elems`` elements; each
bucket padded to a multiple of the group's size, and rank ``r`` owning its ``r``-th chunk.

Kept apart from the optimizer because two sides need the same arithmetic: the trainers, which
step their chunks, and whoever joins the chunks every rank published back into whole tensors
(``optim_entries.load_optim_state``: a trainer that takes the pool over, a checkpoint). Pure
Python: importing it loads no torch.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence


class FlatLayout:
    """The buckets of ``numels`` (each weight's element count, in parameter order)."""

    def __init__(self, numels: Sequence[int], bucket_elems: int) -> None:
        self.starts = [0]  # where each weight begins in the flat index space
        for n in numels:
            self.starts.append(self.starts[-1] + n)
        total = self.starts[-1]
        self.buckets = [(s, min(s + bucket_elems, total)) for s in range(0, total, bucket_elems)]

    def chunk(self, bucket: int, world: int) -> int:
        """Each rank's chunk of ``bucket`` (the bucket padded to ``world`` of them)."""
        s, e = self.buckets[bucket]
        return math.ceil((e - s) / world)

    def owned(self, bucket: int, world: int, rank: int) -> tuple[int, int]:
        """The flat range ``rank`` owns of ``bucket`` (empty past the bucket's end)."""
        s, e = self.buckets[bucket]
        c = self.chunk(bucket, world)
        return min(s + rank * c, e), min(s + (rank + 1) * c, e)

    def pieces(self, lo: int, hi: int) -> list[tuple[int, int, int, int]]:
        """(weight, start in it, end in it, offset from ``lo``) covering flat ``[lo, hi)``."""
        out = []
        i = bisect_right(self.starts, lo) - 1
        n = len(self.starts) - 1
        while lo < hi and i < n:
            a, b = max(lo, self.starts[i]), min(hi, self.starts[i + 1])
            if a < b:
                out.append((i, a - self.starts[i], b - self.starts[i], a - lo))
            i += 1
            if self.starts[i] >= hi:
                break
        return out
