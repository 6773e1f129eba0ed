"""flow.jsonl: FlowSampler on a real controller (tests/controller/harness.py plays the workers
through the protocol; the controller itself is the one we ship), its time across a resume, a
write that fails, and the plots drawn from it."""

from __future__ import annotations

import asyncio
import logging
import re
import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "controller"))
from harness import Harness, done  # noqa: E402

from pivotflow.flow_samples import FLOW_KEYS, FlowSampler, read_flow  # noqa: E402
from pivotflow.metrics import RunRecorder, StepRecord, read_metrics  # noqa: E402
from pivotflow.metrics_plots import make_plots  # noqa: E402
from pivotflow.protocol import JobsDone, TrainDone, TrainStep  # noqa: E402

pytestmark = pytest.mark.timeout(60)
DOC = Path(__file__).resolve().parents[1] / "docs" / "records.md"


async def _one_step_sampled(h: Harness, sampler: FlowSampler) -> list[dict[str, object]]:
    """Drive a 1-step run of two samples by hand, sampling the flow at each point where the
    jobs in flight are known; returns the lines written, in order."""
    assert sampler.sample() is False  # run() has not started: no clock origin yet
    run = asyncio.ensure_future(h.ctl.run())
    await h.join_all()
    first, second = await h.jobs("w-roll")
    assert sampler.sample()  # both rollouts out
    h.ends["w-roll"].send(JobsDone(results=[done(second.job_id, "12")]))
    (judged,) = await h.jobs("w-judge")
    assert sampler.sample()  # one rollout out, one judgement out
    h.ends["w-roll"].send(JobsDone(results=[done(first.job_id, "99")]))
    (judged2,) = await h.jobs("w-judge")
    h.ends["w-judge"].send(JobsDone(results=[done(judged.job_id, "Y"),
                                             done(judged2.job_id, "N")]))
    step = await asyncio.wait_for(h.ends["w-train"].recv(), 10)
    assert isinstance(step, TrainStep)
    h.ends["w-train"].send(TrainDone(step=0, version=1, stats={}, job_ids=[]))
    await asyncio.wait_for(run, 10)
    assert sampler.sample()  # after the step
    return read_flow(sampler.path)


async def test_the_sampler_reads_a_live_controller(tmp_path: Path) -> None:
    h = Harness(steps=1, group_size=2, groups_per_step=1)
    sampler = FlowSampler(h.ctl, tmp_path / "flow.jsonl")
    lines = await _one_step_sampled(h, sampler)
    assert len(lines) == 3 and sampler.samples == 3
    assert all(set(line) == set(FLOW_KEYS) for line in lines)
    assert [line["jobs_in_flight"] for line in lines] == [
        {"rollout": 2, "genrm": 0}, {"rollout": 1, "genrm": 1}, {"rollout": 0, "genrm": 0}]
    assert all(line["pools"] == {"rollout": 1, "genrm": 1, "trainer": 1} for line in lines)
    assert all(line["queue_depth"] == {"prompts->rollout": 0, "rollout->genrm": 0}
               for line in lines)  # free workers take each sample at once
    assert [line["policy_version"] for line in lines] == [0, 0, 1]
    assert [line["segment"] for line in lines] == [0, 0, 0]
    times = [float(line["time_s"]) for line in lines]  # type: ignore[arg-type]
    assert 0.0 <= times[0] <= times[1] <= times[2]
    assert h.records[0]["time_s"] <= times[2]  # metrics.jsonl's clock: the same origin


async def test_a_resumed_segment_continues_the_runs_time(tmp_path: Path) -> None:
    """A second sampler on the same file (a resume) counts the next segment and starts its
    time where metrics.jsonl's checkpoint step was, as run.py continues time_s."""
    rec = RunRecorder(tmp_path)
    for step, t in ((1, 5.0), (2, 9.0), (3, 14.0)):  # step 3: after the checkpoint, taken again
        rec.record_step(StepRecord(step=step, time_s=t, policy_version=step, samples=2,
                                   reward_mean=0.5))
    (tmp_path / "flow.jsonl").write_bytes(b'{"time_s": 13.0, "segment": 0}\n{"time_s": 1')
    h = Harness(steps=2, group_size=2, groups_per_step=1)
    h.ctl.version = 1  # as snapshot.restore leaves a controller resumed from step 1
    sampler = FlowSampler(h.ctl, tmp_path / "flow.jsonl")
    assert sampler.segment == 1  # and the torn last line is cut, so the next one is whole
    run = asyncio.ensure_future(h.ctl.run())
    await h.join_all()
    await h.jobs("w-roll")
    assert sampler.sample()
    lines = read_flow(tmp_path / "flow.jsonl")
    assert [line["segment"] for line in lines] == [0, 1]
    assert sampler.time_offset_s == 5.0  # step 1's time_s
    assert 5.0 <= float(lines[1]["time_s"]) < 13.0  # type: ignore[arg-type]
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)


def test_a_write_that_fails_stops_sampling_without_raising(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    h = Harness(steps=1)
    h.ctl.started_at = h.ctl.clock.now()  # as run() sets it
    sampler = FlowSampler(h.ctl, tmp_path)  # a folder: every write fails
    with caplog.at_level(logging.WARNING, logger="pivotflow.flow_samples"):
        assert sampler.sample() is False
        assert sampler.sample() is False
    assert caplog.text.count("flow samples stopped after 0 line(s)") == 1
    good = FlowSampler(h.ctl, tmp_path / "flow.jsonl")
    assert good.sample() and good.line() is not None
    good.close()
    assert good.sample() is False and len(read_flow(tmp_path / "flow.jsonl")) == 1


def test_a_malformed_line_names_the_file_and_line(tmp_path: Path) -> None:
    from pivotflow.errors import MetricsError

    path = tmp_path / "flow.jsonl"
    path.write_text('{"time_s": 1}\nnope\n{"time_s": 2}\n')
    with pytest.raises(MetricsError, match=r"flow\.jsonl:2: malformed flow sample"):
        read_flow(path)


def test_every_flow_key_is_documented() -> None:
    text = DOC.read_text()
    assert "## flow.jsonl" in text
    missing = sorted(set(FLOW_KEYS) - set(re.findall(r"`([^`\n]+)`", text)))
    assert not missing, f"flow.jsonl keys not in docs/records.md: {missing}"


def _png_height(path: Path) -> int:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int(struct.unpack(">I", data[20:24])[0])


async def test_plots_draw_the_sampled_queues_and_jobs_in_flight(tmp_path: Path) -> None:
    """With flow.jsonl beside metrics.jsonl the pools/queues figure gets its third panel
    (jobs in flight); without it, two (queues at step ends)."""
    h = Harness(steps=1, group_size=2, groups_per_step=1)
    await _one_step_sampled(h, FlowSampler(h.ctl, tmp_path / "flow.jsonl"))
    rec = RunRecorder(tmp_path)
    (record,) = h.records
    std = {k: record[k] for k in ("step", "time_s", "policy_version", "samples", "reward_mean",
                                  "task_accuracy", "pools", "queue_depth")}
    rec.record_step(StepRecord(**std))
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 1
    with_flow = _png_height(make_plots(tmp_path / "metrics.jsonl", tmp_path / "a")[1])
    (tmp_path / "flow.jsonl").unlink()
    without = _png_height(make_plots(tmp_path / "metrics.jsonl", tmp_path / "b")[1])
    assert with_flow > without
