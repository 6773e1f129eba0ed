"""How a joining batch is split into prefill passes: shared by the embedded engine
(``engines/torch/engine.py``) and the simulator's cost of it (``sim/cost_model.py``), which
must not import torch.

A pass prefills its sequences right-padded to its longest. Sequences resumed from a prefix (a
migration, a partial rollout's carry) join beside fresh prompts, and in one pass a 450-token
prefix padded 63 six-token prompts to 450 each: 1.0-2.1 s of prefill on the CPU bench where
the real tokens took a few hundredths (bench/workloads/README.md, "Each baseline with partial
rollouts on"). So joiners are prefilled shortest first, in groups whose longest is at most
twice the shortest or ``PREFILL_PAD_TOKENS`` past it (short ones cost less padded than in a
pass of their own).
"""

from __future__ import annotations

from collections.abc import Sequence

PREFILL_PAD_TOKENS = 32


def prefill_groups(lengths: Sequence[int]) -> list[tuple[int, int]]:
    """``[a, b)`` index ranges of ``lengths`` (sorted ascending) prefilled together: a group
    takes the next length while it is at most ``max(2 * first, first + PREFILL_PAD_TOKENS)``, so
    padding at most doubles a group's tokens beyond a short one's slack."""
    groups: list[tuple[int, int]] = []
    a = 0
    for i in range(1, len(lengths) + 1):
        if i == len(lengths) or lengths[i] > max(2 * lengths[a], lengths[a] + PREFILL_PAD_TOKENS):
            groups.append((a, i))
            a = i
    return groups


def prefill_shapes(lengths: Sequence[int]) -> list[tuple[int, int]]:
    """(sequences, padded width) of each pass that prefills ``lengths`` (any order)."""
    ordered = sorted(lengths)
    return [(b - a, ordered[b - 1]) for a, b in prefill_groups(ordered)]
