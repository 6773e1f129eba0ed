"""The barriers: samples waiting for the rest of their group at a group, filter or train stage.

One owner for what core, the skip path, partial rollouts, snapshots and the lost-group check
used to reach into as a dict of dicts. A group leaves a barrier whole (``arrive`` returns it
once its last sample is in), or is taken out by a part that throws it away or saves it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from pivotflow.controller.sample import Sample


class Barriers:
    """Per barrier stage index, the groups waiting there (group id -> samples so far)."""

    __slots__ = ("_at",)

    def __init__(self, stages: Iterable[int]) -> None:
        self._at: dict[int, dict[int, list[Sample]]] = {i: {} for i in stages}

    def arrive(self, stage: int, sample: Sample) -> list[Sample] | None:
        """``sample`` reached ``stage``: its whole group when it was the last one, else None."""
        waiting = self._at[stage]
        group = waiting.setdefault(sample.group_id, [])
        group.append(sample)
        if len(group) < sample.group_size:
            return None
        del waiting[sample.group_id]
        # in sample order, not arrival order: what a group function sees and the trainer's
        # batch then do not depend on which worker or async call finished first, so a step's
        # sums (and the run after it) are the same whatever the timing
        group.sort(key=lambda s: s.sample_id)
        return group

    def put_back(self, stage: int, sample: Sample) -> None:
        """A restored sample waits at ``stage`` again (a snapshot's, in its saved order)."""
        self._at[stage].setdefault(sample.group_id, []).append(sample)

    def complete(self, stages: Iterable[int]) -> list[tuple[int, list[Sample]]]:
        """(stage, group) for each whole group waiting at ``stages``, taken out: a restored
        snapshot's groups whose ``async def`` group or filter call was in flight
        (async_calls.py)."""
        whole = [(stage, gid) for stage in stages for gid, group in self._at[stage].items()
                 if len(group) >= group[0].group_size]
        return [(stage, self._at[stage].pop(gid)) for stage, gid in whole]

    def take_group(self, group_id: int) -> list[Sample]:
        """Every waiting sample of ``group_id``, out of every barrier (it is thrown away, or
        generated again)."""
        found: list[Sample] = []
        for waiting in self._at.values():
            found += waiting.pop(group_id, [])
        return found

    def count(self, group_id: int) -> int:
        """Samples of ``group_id`` waiting at any barrier."""
        return sum(len(waiting.get(group_id, ())) for waiting in self._at.values())

    def group_ids(self) -> set[int]:
        """Every group with a sample waiting somewhere."""
        return {g for waiting in self._at.values() for g in waiting}

    def waiting(self) -> Iterator[tuple[int, Sample]]:
        """(stage, sample) for every waiting sample, by stage, group and arrival."""
        for stage, groups in self._at.items():
            for group in groups.values():
                for sample in group:
                    yield stage, sample
