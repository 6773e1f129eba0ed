"""What flows through the controller: samples, and the ledger that proves exactly-once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Sample:
    """One response to one prompt. ``fields`` holds every named field stages read and write."""

    sample_id: int
    group_id: int
    group_size: int
    admit_version: int
    seed: int
    fields: dict[str, Any] = field(default_factory=dict)
    enqueued_at: float = 0.0


@dataclass(slots=True)
class Ledger:
    """Counts that must balance: every admitted group is trained once or filtered once."""

    prompts_in: int = 0
    groups_trained: int = 0
    samples_trained: int = 0
    groups_filtered: int = 0
    duplicates: int = 0
    late_results: int = 0
    judge_failures: int = 0
    trained_groups: set[int] = field(default_factory=set)

    def mark_trained(self, group_id: int, samples: int) -> bool:
        """Record a trained group; False (and a counted duplicate) if it was trained before."""
        if group_id in self.trained_groups:
            self.duplicates += 1
            return False
        self.trained_groups.add(group_id)
        self.groups_trained += 1
        self.samples_trained += samples
        return True
