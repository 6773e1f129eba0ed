"""bench/remote_reward.py: a 1-step run awaiting a real server process and one computing the
reward in process write every key, and the inline bound is computed from the local run (no
timing asserted; the inline variant is the example's graph.call=inline, two runs' worth of
suite time left out)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.mark.timeout(600)
def test_each_variant_runs_and_the_summary_has_every_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        bench_script: Callable[[str], ModuleType]) -> None:
    bench = bench_script("remote_reward")
    out = tmp_path / "runs.jsonl"
    bench.main(["--steps", "1", "--latencies-ms", "0", "--repeats", "1", "--variants",
                "await,local", "--out", str(out)])
    lines = [json.loads(t) for t in out.read_text().splitlines()]
    assert [ln["variant"] for ln in lines] == ["await", "local"]
    for ln in lines:
        assert ln["samples_per_s"] > 0 and ln["latency_ms"] == 0.0
        assert f"graph.call={ln['variant']}" in ln["command"]
        assert "reward_url" not in ln["command"]  # (a port of this sitting's server)
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for v in ("await", "local"):
        assert summary[f"{v}_samples_per_s_0ms"] > 0
    assert "inline_samples_per_s_0ms" not in summary and "await_over_inline_0ms" not in summary
    assert summary["await_over_local_0ms"] == pytest.approx(
        summary["await_samples_per_s_0ms"] / summary["local_samples_per_s_0ms"], rel=0.01)
    # with a server that answers at once, inline's bound is the local run's rate
    assert summary["inline_bound_samples_per_s_0ms"] == pytest.approx(
        summary["local_samples_per_s_0ms"], abs=0.1)
