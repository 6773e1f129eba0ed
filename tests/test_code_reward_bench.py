"""bench/code_reward.py at its smallest: both variants run and the summary has every key."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

KEYS = {"sandboxed_programs_per_s", "unsandboxed_programs_per_s", "sandboxed_over_unsandboxed",
        "sandboxed_cases_per_s", "case_start_ms", "case_fork_ms", "runs", "programs", "cases",
        "workers", "language", "cxx_header", "case_processes"}


@pytest.mark.timeout(120)
def test_each_variant_runs_and_the_summary_has_every_key(
        bench_script: Callable[[str], ModuleType]) -> None:
    out = bench_script("code_reward").main(["--programs", "4", "--cases", "2", "--repeats", "1"])
    assert set(out) >= KEYS
    assert len(out["runs"]["bwrap"]) == len(out["runs"]["none"]) == 1
    assert out["sandboxed_programs_per_s"] > 0 and out["case_start_ms"] > 0
    assert out["case_fork_ms"] > 0
