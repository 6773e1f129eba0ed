"""bench/code_interpreter.py at its smallest: both variants run and the summary has every key."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

KEYS = {"calls", "workers", "runs", "code_calls_per_s", "code_p50_ms", "code_p99_ms",
        "calculator_calls_per_s", "code_over_calculator"}


@pytest.mark.timeout(120)
def test_each_variant_runs_and_the_summary_has_every_key(
        bench_script: Callable[[str], ModuleType]) -> None:
    out = bench_script("code_interpreter").main(["--calls", "4", "--repeats", "1"])
    assert set(out) >= KEYS
    assert len(out["runs"]["code"]) == len(out["runs"]["calculator"]) == 1
    assert out["code_calls_per_s"] > 0 and out["code_p50_ms"] > 0
