"""bench/partial_rollout.py --real: a 2-step run of each setting writes every key (no timing)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

LINE_KEYS = {"run", "graph", "steps", "max_staleness", "setting", "task_accuracy_first20",
             "task_accuracy_last20", "task_accuracy_per20", "run_s", "samples_per_s",
             "stale_token_share", "tokens_generated", "carried_over", "groups_refused", "ledger",
             "carried_token_share", "seed", "task_accuracy_per_step"}
SUMMARY_KEYS = {"task_accuracy_last20", "on_minus_off_last20", "noise_last20", "within_noise",
                "carried_token_share", "samples_per_s"}


def test_token_weighted_skips_the_first_step_and_weighs_by_tokens(
        bench_script: Callable[[str], ModuleType]) -> None:
    bench = bench_script("partial_rollout")
    recs = [{"samples": 4, "response_len_mean": 1.0, "carried_token_share": 1.0},
            {"samples": 4, "response_len_mean": 3.0, "carried_token_share": 1.0},
            {"samples": 4, "response_len_mean": 1.0, "carried_token_share": 0.0}]
    assert bench.token_weighted(recs, "carried_token_share") == 0.75
    assert bench.token_weighted(recs[:1], "carried_token_share") == 1.0


@pytest.mark.timeout(900)
def test_real_mode_writes_every_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    bench_script: Callable[[str], ModuleType]) -> None:
    bench = bench_script("partial_rollout")
    out, png = tmp_path / "runs.jsonl", tmp_path / "accuracy.png"
    args = ["--real", "--steps", "2", "--seeds", "0", "--set", "graph.groups_per_step=2",
            "--set", "graph.group_size=4", "--out", str(out), "--png", str(png), "--quiet"]
    bench.main(args)
    lines = [json.loads(t) for t in out.read_text().splitlines()]
    assert [ln["run"] for ln in lines] == ["off0", "on0", "over0"]
    for ln in lines:
        assert set(ln) >= LINE_KEYS, LINE_KEYS - set(ln)
        assert ln["steps"] == 2 and len(ln["task_accuracy_per_step"]) == 2
        assert ln["ledger"]["lost"] == 0 and ln["ledger"]["duplicates"] == 0
    assert "partial_rollout=true" in lines[1]["setting"]
    assert "over_sample=0.5" in lines[2]["setting"]
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(summary) >= SUMMARY_KEYS
    assert png.stat().st_size > 0
    png.unlink()
    bench.main(["--plot-only", "--out", str(out), "--png", str(png)])
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["task_accuracy_last20"] == summary["task_accuracy_last20"]
    assert png.stat().st_size > 0
