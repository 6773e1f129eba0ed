"""What flows through the controller: samples, and the ledger that proves exactly-once."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(slots=True)
class Sample:
    """One response to one prompt. ``fields`` holds every named field stages read and write
    (stage functions get them as keyword arguments); ``private`` the controller's own state of
    it (a partial generation to resume, a tool call in progress), which they never see."""

    sample_id: int
    group_id: int
    group_size: int
    admit_version: int
    seed: int
    fields: dict[str, Any] = field(default_factory=dict)
    enqueued_at: float = 0.0
    private: dict[str, Any] = field(default_factory=dict)
    # graph stage index -> when the sample last reached it (the controller's clock): the step
    # record's path (``admitted_s``, ``stage_done_s``, ``train_ready_s``); not in a snapshot,
    # so a resumed sample has only what it reached since
    reached: dict[int, float] = field(default_factory=dict)


def held_out(group_id: int) -> bool:
    """Whether a group id is an evaluation sample's (controller/evaluation.py: they are
    negative, training's count up from 0): the one test every part that passes them over uses."""
    return group_id < 0


@dataclass(slots=True)
class Ledger:
    """Counts that must balance: every admitted group is trained, filtered or skipped once."""

    prompts_in: int = 0
    groups_trained: int = 0
    samples_trained: int = 0
    groups_filtered: int = 0
    groups_skipped: int = 0  # dropped by a stage function that failed with on_error=skip
    duplicates: int = 0
    late_results: int = 0
    judge_failures: int = 0
    # Groups settled (trained or filtered): every id below ``settled_below``, plus the few
    # above it settled out of order. Ids are handed out densely, so this stays small however
    # long the run (a set of every id would grow by ~70 bytes per group).
    settled_below: int = 0
    settled_above: set[int] = field(default_factory=set)

    def counters(self) -> dict[str, int]:
        """Every count above, by name: what a snapshot keeps (read from the fields, so a new
        counter is kept too; groups_skipped was once left out and a resume lost it)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if not f.name.startswith("settled")}

    def restore(self, counters: dict[str, int], settled_below: int,
                settled_above: Iterable[int]) -> None:
        """A snapshot's counts (``counters()``) and settled groups."""
        for key, value in counters.items():
            setattr(self, key, value)
        self.settled_below, self.settled_above = settled_below, set(settled_above)

    def count_judge_failure(self) -> None:
        """A judge's verdict that could not be parsed."""
        self.judge_failures += 1

    def count_dropped(self, *, filtered: bool) -> None:
        """A group dropped by a filter (``filtered``) or by a failed stage (on_error=skip)."""
        if filtered:
            self.groups_filtered += 1
        else:
            self.groups_skipped += 1

    def count_late(self) -> None:
        """A result that came twice, or from a worker no longer serving it, was dropped."""
        self.late_results += 1

    def settled(self, group_id: int) -> bool:
        return group_id < self.settled_below or group_id in self.settled_above

    def settle(self, group_id: int) -> None:
        self.settled_above.add(group_id)
        while self.settled_below in self.settled_above:
            self.settled_above.remove(self.settled_below)
            self.settled_below += 1

    def mark_trained(self, group_id: int, samples: int) -> bool:
        """Record a trained group; False (and a counted duplicate) if it was trained before."""
        if self.settled(group_id):
            self.duplicates += 1
            return False
        self.settle(group_id)
        self.groups_trained += 1
        self.samples_trained += samples
        return True
