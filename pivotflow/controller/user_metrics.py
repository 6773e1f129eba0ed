"""Scalars a graph's own code logs while a run goes on (TRL's ``log_metric``).

A stage function calls ``log_metric("format_violations", 3.0)`` (or a TRL reward function
calls the ``log_metric`` it is passed, ``rl/reward_adapters.trl_reward``); each name's values
since the previous step record are averaged into that record's ``logged_metrics``, as TRL
averages its metrics over a logging step. The controller owns the one ``UserMetrics`` of its
run and makes it the current one while it runs (stage functions run on its thread, inline);
outside a run there is nowhere to log, and ``log_metric`` says so.

Values logged but not yet in a step record when a run stops are not in a checkpoint: a resume
starts with none (these are figures, not the ledger). Values logged while an evaluation round
scores its held-out samples go to the next step record too.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator
from contextlib import contextmanager

from pivotflow.errors import PivotflowError


class UserMetrics:
    """Each name's sum and count since the last ``drain``; and the run's ``steps``, which a
    TRL reward function reads as ``trainer_state.max_steps`` (``run_steps``)."""

    def __init__(self, steps: int = 0) -> None:
        self._sums: dict[str, list[float]] = {}
        self.steps = steps

    def log(self, name: str, value: float) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"log_metric: the name must be a non-empty string, got {name!r}")
        if (isinstance(value, bool) or not isinstance(value, numbers.Real)
                or not math.isfinite(value)):
            raise ValueError(f"log_metric({name!r}): the value must be a finite number, got "
                             f"{type(value).__name__} {value!r:.40}")
        total = self._sums.setdefault(name, [0.0, 0.0])
        total[0] += float(value)
        total[1] += 1.0

    def drain(self) -> dict[str, float]:
        """Each name's mean since the last drain (names in the order first logged); then
        nothing is held."""
        means = {name: s / n for name, (s, n) in self._sums.items()}
        self._sums.clear()
        return means


_current: UserMetrics | None = None


@contextmanager
def recording(metrics: UserMetrics) -> Iterator[None]:
    """``metrics`` is where ``log_metric`` goes while the block runs (the controller's run)."""
    global _current
    before, _current = _current, metrics
    try:
        yield
    finally:
        _current = before


def recording_now() -> bool:
    """True while a run records (a part that logs figures of its own, such as the code
    reward's outcomes, logs nothing when called outside a run)."""
    return _current is not None


def log_metric(name: str, value: float) -> None:
    """Log ``value`` under ``name``: averaged into the next step record's ``logged_metrics``.

    Raises:
        ValueError: the name is not a non-empty string or the value not a finite number.
        PivotflowError: no run is recording (called outside a running graph's stage).
    """
    if _current is None:
        raise PivotflowError("log_metric: no run is recording; call it from a stage function "
                             "of a running graph")
    _current.log(name, value)


def run_steps() -> int:
    """The optimizer steps the recording run makes (its ``steps``; after a ``--resume`` with
    more, the new number, as TRL's ``max_steps`` after a resume), 0 outside a run (TRL's
    ``TrainerState`` default)."""
    return 0 if _current is None else _current.steps
