"""``log_metric`` (controller/user_metrics.py): the scalars a graph's own code logs, averaged per
name into the next step record. (A whole run's: tests/test_prompt_files.py.)"""

from __future__ import annotations

import math

import pytest

from pivotflow.controller.user_metrics import UserMetrics, log_metric, recording
from pivotflow.errors import PivotflowError


def test_each_name_is_averaged_since_the_last_drain() -> None:
    metrics = UserMetrics()
    with recording(metrics):
        log_metric("format_violations", 3)
        log_metric("judge_latency_s", 0.5)
        log_metric("format_violations", 1.0)
    assert metrics.drain() == {"format_violations": 2.0, "judge_latency_s": 0.5}
    assert metrics.drain() == {}  # drained: the next record starts empty


def test_recording_ends_with_its_block_and_nests() -> None:
    outer, inner = UserMetrics(), UserMetrics()
    with recording(outer):
        with recording(inner):
            log_metric("a", 1.0)
        log_metric("b", 2.0)
    assert inner.drain() == {"a": 1.0} and outer.drain() == {"b": 2.0}
    with pytest.raises(PivotflowError, match="^log_metric: no run is recording; call it from a "
                                             "stage function of a running graph$"):
        log_metric("a", 1.0)


@pytest.mark.parametrize(("name", "value", "error"), [
    ("", 1.0, r"^log_metric: the name must be a non-empty string, got ''$"),
    (3, 1.0, r"^log_metric: the name must be a non-empty string, got 3$"),
    ("x", math.nan, r"^log_metric\('x'\): the value must be a finite number, got float nan$"),
    ("x", "0.5", r"^log_metric\('x'\): the value must be a finite number, got str '0.5'$"),
    ("x", True, r"^log_metric\('x'\): the value must be a finite number, got bool True$"),
])
def test_a_bad_name_or_value_is_a_one_line_error(name: object, value: object,
                                                 error: str) -> None:
    metrics = UserMetrics()
    with recording(metrics), pytest.raises(ValueError, match=error):
        log_metric(name, value)  # type: ignore[arg-type]
    assert metrics.drain() == {}  # nothing half-logged
