"""Which groups go into the next optimizer step, so that staleness stays bounded."""

from __future__ import annotations

from pivotflow.controller.sample import Sample


class TrainBuffer:
    """Groups admitted, and groups complete and waiting for the trainer.

    Rule: step ``t`` (trained on policy version ``t``, publishing ``t + 1``) may include a group
    admitted at version ``a`` only if ``t - a <= max_staleness``; so a group with
    ``a + max_staleness == t`` must go into step ``t``, and the step waits for it. Admission
    keeps at most ``groups_per_step`` such groups in flight, so a step never needs more.
    """

    def __init__(self, groups_per_step: int, max_staleness: int) -> None:
        self.n = groups_per_step
        self.s = max_staleness
        self.open: dict[int, int] = {}  # group_id -> admit version, until trained or dropped
        self.ready: dict[int, list[Sample]] = {}
        self.ready_samples = 0  # samples in ``ready`` (the planner asks every interval)

    def admitted(self, group_id: int, version: int) -> None:
        self.open[group_id] = version

    def dropped(self, group_id: int) -> None:
        self.open.pop(group_id, None)

    def add(self, group: list[Sample]) -> None:
        self.ready[group[0].group_id] = group
        self.ready_samples += len(group)

    def can_take(self, version: int) -> bool:
        """Whether ``take(version)`` would return a batch now."""
        if len(self.ready) < self.n:
            return False
        return all(g in self.ready for g, a in self.open.items() if a + self.s <= version)

    def take(self, version: int) -> list[list[Sample]] | None:
        """The next step's groups, oldest first, or None while the step must wait."""
        if len(self.ready) < self.n:
            return None
        must = [g for g, a in self.open.items() if a + self.s <= version]
        if any(g not in self.ready for g in must):
            return None
        chosen = sorted(must)
        rest = sorted(g for g in self.ready if g not in set(chosen))
        chosen += rest[: max(0, self.n - len(chosen))]
        batch = [self.ready.pop(g) for g in chosen]
        self.ready_samples -= sum(map(len, batch))
        for g in chosen:
            self.open.pop(g, None)
        return batch

    def requeue(self, batch: list[list[Sample]]) -> None:
        """Put a batch whose step failed back, as if it had never been taken."""
        for group in batch:
            self.open[group[0].group_id] = group[0].admit_version
            self.ready[group[0].group_id] = group
            self.ready_samples += len(group)

    def in_flight(self) -> int:
        return len(self.open)
