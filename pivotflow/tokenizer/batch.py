"""Batching token ids: right padding with a mask."""

from __future__ import annotations

from collections.abc import Sequence


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[list[list[int]], list[list[int]]]:
    """Right-pad to the longest; returns (ids, mask) as nested lists."""
    width = max((len(s) for s in seqs), default=0)
    ids = [list(s) + [pad_id] * (width - len(s)) for s in seqs]
    mask = [[1] * len(s) + [0] * (width - len(s)) for s in seqs]
    return ids, mask
