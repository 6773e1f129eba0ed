"""Cores shared by simulated workers: processor sharing, for calibrating against a CPU run.

On a GPU cluster every worker has its own device. On the CPU machine ``bench/elastic.py`` runs
on, three worker processes share two cores: while more workers are busy than there are cores,
each runs at ``cores / busy`` of its speed (the kernel shares the cores out evenly). A worker
joins when it starts work (decoding, prefilling, loading a role, training) and leaves when it
has none; every change of the busy count stretches or shrinks the remaining work of the others.
"""

from __future__ import annotations

from typing import Protocol


class SharesCores(Protocol):
    def rescale(self, old: float, new: float) -> None:
        """Remaining work now runs ``new`` times slower than alone (it ran ``old`` times)."""


class CoreShare:
    """The busy workers on ``cores`` cores; ``factor`` is how much slower each one runs."""

    def __init__(self, cores: int) -> None:
        self.cores = cores
        self.busy: dict[int, SharesCores] = {}  # id(worker) -> worker, in order of joining

    @property
    def factor(self) -> float:
        return max(1.0, len(self.busy) / self.cores)

    def enter(self, worker: SharesCores) -> None:
        if id(worker) not in self.busy:
            self._change(worker, True)

    def leave(self, worker: SharesCores) -> None:
        if id(worker) in self.busy:
            self._change(worker, False)

    def _change(self, worker: SharesCores, busy: bool) -> None:
        old = self.factor
        if busy:
            self.busy[id(worker)] = worker
        else:
            del self.busy[id(worker)]
        new = self.factor
        if new != old:
            for other in list(self.busy.values()):
                if other is not worker:
                    other.rescale(old, new)
