"""docs/records.md names every key a run writes: the top-level keys of metrics.jsonl's lines,
summary.json, config.json and shifts.jsonl of a real 2-step run of graphs/grpo_rule.py (the
run test_resume.py's ``finished`` fixture makes), and the keys the code declares for records
a short run may not write (samples, shifts, the config's every ``--set`` key). Records are
interfaces: a new key must be documented, and a documented one never renamed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest
import test_resume

from pivotflow.config import RunConfig
from pivotflow.controller.shifts import ShiftRecord
from pivotflow.metrics import STEP_KEYS, SUMMARY_KEYS, Ledger, read_metrics, read_summary
from pivotflow.sinks.samples import SAMPLE_KEYS

DOC = Path(__file__).resolve().parents[1] / "docs" / "records.md"
pytestmark = pytest.mark.timeout(120)

finished = test_resume.finished  # (graph file, run folder) of a finished 2-step grpo_rule run


def documented() -> set[str]:
    """Every `` `name` `` on the page."""
    return set(re.findall(r"`([^`\n]+)`", DOC.read_text()))


def assert_documented(keys: set[str], where: str) -> None:
    missing = sorted(keys - documented())
    assert not missing, f"{where}: keys not in docs/records.md as `key`: {missing}"


def test_every_key_a_run_writes_is_documented(finished: tuple[Path, Path]) -> None:
    _, out = finished
    lines = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in lines] == [1, 2]
    assert_documented({k for r in lines for k in r}, "metrics.jsonl")
    assert_documented(set(read_summary(out / "summary.json")), "summary.json")
    assert_documented(set(json.loads((out / "config.json").read_text())), "config.json")
    shifts = read_metrics(out / "shifts.jsonl")  # none in a 2-step run, usually
    assert_documented({k for r in shifts for k in r}, "shifts.jsonl")
    manifest = out / "checkpoints" / (out / "checkpoints" / "LATEST").read_text() / "manifest.json"
    assert_documented(set(json.loads(manifest.read_text())), "manifest.json")


def test_every_key_the_code_declares_is_documented() -> None:
    assert_documented(set(STEP_KEYS) | {"shift_events"}, "StepRecord")
    assert_documented(set(SUMMARY_KEYS), "RunSummary")
    assert_documented({f.encode_name for f in msgspec.structs.fields(Ledger)}, "Ledger")
    assert_documented(set(SAMPLE_KEYS), "samples.jsonl (SAMPLE_KEYS)")
    assert_documented(set(ShiftRecord("w0", "a", "b", 0.0, 0).as_record()) | {"planner"},
                      "shifts.jsonl (ShiftRecord)")
    assert_documented(set(RunConfig.__struct_fields__), "config.json (RunConfig)")


def test_an_undocumented_key_fails_with_its_name() -> None:
    with pytest.raises(AssertionError, match=r"metrics.jsonl: .*\['not_a_documented_key'\]"):
        assert_documented({"step", "not_a_documented_key"}, "metrics.jsonl")
