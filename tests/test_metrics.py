"""Run records (metrics.jsonl, summary.json, config.json, plots) and the rate meters."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from pivotflow.errors import MetricsError
from pivotflow.metrics import (
    EwmaRate,
    Ledger,
    Rate,
    RunRecorder,
    RunSummary,
    ShiftEvent,
    StepRecord,
    read_metrics,
    read_summary,
)
from pivotflow.metrics_plots import make_plots

STEP_KEYS = {
    "step",
    "time_s",
    "policy_version",
    "samples",
    "reward_mean",
    "task_accuracy",
    "pools",
    "queue_depth",
    "shifts",
    "migrations",
    "tokens_generated",
}
SUMMARY_KEYS = {
    "steps",
    "wall_s",
    "samples_per_s",
    "tokens_per_s",
    "shifts",
    "migrations",
    "worker_restarts",
    "ledger",
}
LEDGER_KEYS = {"prompts_in", "groups_trained", "samples_trained", "lost", "duplicates"}


def _step(step: int, **kw: object) -> StepRecord:
    """A plausible record of a small run: rollout-heavy early, then a shift to genrm."""
    rollout = 3 if step < 4 else 2
    fields: dict[str, object] = {
        "step": step,
        "time_s": 2.0 * step,
        "policy_version": step,
        "samples": 16,
        "reward_mean": 0.1 * step,
        "task_accuracy": min(1.0, 0.08 * step),
        "pools": {"rollout": rollout, "genrm": 5 - rollout, "train": 1},
        "queue_depth": {"rollout->genrm": (step * 7) % 11, "genrm->train": step % 3},
        "shifts": 0 if step < 4 else 1,
        "migrations": 0 if step < 4 else 5,
        "tokens_generated": 1000 * step,
    }
    fields.update(kw)
    return StepRecord(**fields)  # type: ignore[arg-type]


def test_step_line_has_exactly_the_interface_keys(tmp_path: Path) -> None:
    rec = RunRecorder(tmp_path)
    rec.record_step(_step(1, task_accuracy=None))
    line = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert set(line) == STEP_KEYS
    assert line["task_accuracy"] is None
    assert line["pools"] == {"rollout": 3, "genrm": 2, "train": 1}


def test_extra_and_shift_events_are_flattened(tmp_path: Path) -> None:
    rec = RunRecorder(tmp_path)
    event = ShiftEvent(time_s=7.5, from_="rollout", to="genrm")
    rec.record_step(_step(4, shift_events=[event], extra={"loss": 0.25, "nan": math.nan}))
    (line,) = read_metrics(tmp_path / "metrics.jsonl")
    assert set(line) == STEP_KEYS | {"shift_events", "loss", "nan"}
    assert line["shift_events"] == [{"time_s": 7.5, "from": "rollout", "to": "genrm"}]
    assert line["loss"] == 0.25 and line["nan"] is None  # non-finite is written as null
    with pytest.raises(MetricsError, match=r"extra keys \['step'\] clash"):
        rec.record_step(_step(5, extra={"step": 1}))
    with pytest.raises(MetricsError, match=r"extra keys \['shift_events'\] clash"):
        rec.record_step(_step(5, shift_events=[event], extra={"shift_events": []}))
    # shift events already as plain dicts (e.g. from a controller's record dict) pass through
    rec.record_step(_step(5, extra={"shift_events": [{"time_s": 9.0, "from": "a", "to": "b"}]}))
    assert read_metrics(tmp_path / "metrics.jsonl")[-1]["shift_events"][0]["time_s"] == 9.0


def test_append_continues_an_existing_file(tmp_path: Path) -> None:
    first = RunRecorder(tmp_path)
    for s in (1, 2):
        first.record_step(_step(s))
    resumed = RunRecorder(tmp_path)
    assert resumed.last_step == 2
    resumed.record_step(_step(3))
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    with pytest.raises(MetricsError, match="step 3 is not after the last recorded step 3"):
        resumed.record_step(_step(3))


def test_resume_truncates_steps_after_the_checkpoint(tmp_path: Path) -> None:
    rec = RunRecorder(tmp_path)
    for s in (1, 2, 3, 4):
        rec.record_step(_step(s))
    assert RunRecorder(tmp_path).truncate_after(2) == 2
    again = RunRecorder(tmp_path)
    again.record_step(_step(3, samples=99))
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["samples"]) for r in rows] == [(1, 16), (2, 16), (3, 99)]


def test_torn_last_line_is_cut_on_open(tmp_path: Path) -> None:
    RunRecorder(tmp_path).record_step(_step(1))
    with open(tmp_path / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 2, "time_')  # a crash mid-append
    rec = RunRecorder(tmp_path)
    assert rec.last_step == 1
    rec.record_step(_step(2))
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


def test_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n\n{"step": 2}\n{"step": 3,,}\n')
    with pytest.raises(MetricsError, match=r"metrics\.jsonl:4: malformed metrics line"):
        read_metrics(path)
    path.write_text('{"step": 1}\n[1, 2]\n')
    with pytest.raises(MetricsError, match=r"metrics\.jsonl:2: expected a JSON object"):
        read_metrics(path)
    with pytest.raises(MetricsError, match="cannot read metrics file"):
        read_metrics(tmp_path / "missing.jsonl")


def test_summary_keys_and_atomic_write(tmp_path: Path) -> None:
    rec = RunRecorder(tmp_path)
    ledger = Ledger(prompts_in=8, groups_trained=8, samples_trained=64, lost=0, duplicates=0)
    summary = RunSummary(
        steps=4,
        wall_s=10.0,
        samples_per_s=6.4,
        tokens_per_s=400.0,
        shifts=1,
        migrations=5,
        worker_restarts=0,
        ledger=ledger,
        extra={"shift_time_s": {"abort": 0.1, "load": 0.4}},
    )
    path = rec.write_summary(summary)
    data = read_summary(path)
    assert set(data) == SUMMARY_KEYS | {"shift_time_s"}
    assert set(data["ledger"]) == LEDGER_KEYS
    assert data["ledger"]["samples_trained"] == 64
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_config_round_trips_with_paths(tmp_path: Path) -> None:
    rec = RunRecorder(tmp_path / "run")
    rec.write_config({"graph": "grpo_genrm", "out": tmp_path, "train": {"lr": 1e-5}})
    assert json.loads((tmp_path / "run" / "config.json").read_text()) == {
        "graph": "grpo_genrm",
        "out": str(tmp_path),
        "train": {"lr": 1e-5},
    }
    with pytest.raises(MetricsError, match="not JSON-encodable"):
        rec.write_config({"bad": object()})


def _is_png(path: Path) -> bool:
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1024


def test_plots_are_real_pngs(tmp_path: Path) -> None:
    rec = RunRecorder(tmp_path)
    for s in range(1, 9):
        events = [ShiftEvent(time_s=7.0, from_="rollout", to="genrm")] if s == 4 else []
        acc = None if s == 2 else min(1.0, 0.1 * s)  # a gap must not break the plot
        rec.record_step(_step(s, shift_events=events, task_accuracy=acc))
    written = rec.make_plots()
    assert sorted(p.name for p in written) == ["pools_queues.png", "reward_accuracy.png"]
    assert all(p.parent == tmp_path / "plots" and _is_png(p) for p in written)


def test_evaluation_rounds_of_n_samples_draw_mean_and_pass_at_n(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """eval.jsonl beside the steps: its rounds on the accuracy axis, with pass@n as a line of
    its own when a round took several samples per prompt (a round without a rule: a gap)."""
    import pivotflow.metrics_plots as metrics_plots

    rec = RunRecorder(tmp_path)
    for s in range(1, 9):
        rec.record_step(_step(s, task_accuracy=0.1 * s))
    rounds = [{"step": s, "samples_per_prompt": 4, "task_accuracy": 0.05 * s,
               "task_pass_at_n": None if s == 4 else 0.1 * s} for s in (0, 4, 8)]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    figures: dict[str, object] = {}
    monkeypatch.setattr(metrics_plots, "_save", lambda fig, path: figures.update({path.name: fig}))
    rec.make_plots()
    figure = figures["reward_accuracy.png"]
    labels = [t.get_text() for t in figure.axes[0].get_legend().texts]  # type: ignore[attr-defined]
    assert "held-out accuracy (evaluation rounds, mean@4)" in labels
    assert "held-out pass@4" in labels


def test_a_run_with_length_figures_gets_the_response_lengths_plot(tmp_path: Path) -> None:
    rec = RunRecorder(tmp_path)
    for s in range(1, 9):  # responses grow until the cap (512) cuts a share of them
        rec.record_step(_step(s, extra={"response_len_mean": 60.0 * s,
                                        "response_len_max": min(512, 128 * s),
                                        "response_clip_ratio": max(0.0, 0.1 * (s - 4))}))
    written = rec.make_plots()
    assert sorted(p.name for p in written) == [
        "pools_queues.png", "response_lengths.png", "reward_accuracy.png"]
    assert all(_is_png(p) for p in written)


def test_a_run_with_trainer_figures_gets_the_entropy_and_clip_plot(tmp_path: Path) -> None:
    rec = RunRecorder(tmp_path)
    for s in range(1, 9):  # entropy collapsing, clipping mostly above
        rec.record_step(_step(s, extra={"train_entropy": 2.0 / s, "train_clip_frac_low": 0.01,
                                        "train_clip_frac_high": 0.02 * s}))
    written = rec.make_plots()
    assert sorted(p.name for p in written) == [
        "entropy_clip.png", "pools_queues.png", "reward_accuracy.png"]
    assert all(_is_png(p) for p in written)


def test_a_run_whose_stages_write_numbers_gets_their_means_plotted(tmp_path: Path) -> None:
    rec = RunRecorder(tmp_path)
    for s in range(1, 9):  # a TRL accuracy reward rising; its format reward on steps 3-8 only
        means = {"reward_accuracy_reward": 0.3 + 0.05 * s}
        if s >= 3:
            means["reward_format_reward"] = 0.5
        rec.record_step(_step(s, extra={"field_means": means,
                                        "logged_metrics": {"judge_latency_s": 0.1 * s}}))
    written = rec.make_plots()
    assert sorted(p.name for p in written) == [
        "field_means.png", "pools_queues.png", "reward_accuracy.png"]
    assert all(_is_png(p) for p in written)


def test_the_step_path_plot_draws_each_known_part(tmp_path: Path) -> None:
    from pivotflow.metrics_plots import path_segments

    rec = RunRecorder(tmp_path)
    for s in range(1, 7):  # max_staleness 1: step s admitted when step s-2 ended (2 s a step)
        path = {"admitted_s": max(0.0, 2.0 * (s - 2)), "train_ready_s": 2.0 * s - 0.6,
                "train_started_s": 2.0 * s - 0.5,
                "stage_done_s": {"rollout": 2.0 * s - 1.5, "genrm": 2.0 * s - 0.6}}
        if s == 3:  # a resumed segment's first step: its restored samples kept no times
            path.update(admitted_s=None, stage_done_s={"rollout": None, "genrm": 5.4})
        rec.record_step(_step(s, extra=path))
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert path_segments(records[3]) == [  # step 4: admitted at 4 s, ended at 8 s
        ("generation", 4.0, 6.5), ("genrm", 6.5, 7.4), ("waiting", 7.4, 7.5),
        ("training", 7.5, 8.0)]  # ("to the trainer": none, the batch was whole at once)
    assert [p for p, _, _ in path_segments(records[2])] == ["waiting", "training"]
    written = rec.make_plots()
    assert sorted(p.name for p in written) == [
        "pools_queues.png", "reward_accuracy.png", "step_path.png"]
    assert all(_is_png(p) for p in written)


def test_plotting_errors_are_warnings_not_failures(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad = tmp_path / "metrics.jsonl"
    bad.write_text("not json\n")
    with caplog.at_level(logging.WARNING, logger="pivotflow.metrics_plots"):
        assert make_plots(bad, tmp_path / "plots") == []
    assert "metrics.jsonl:1" in caplog.text
    assert make_plots(tmp_path / "none.jsonl", tmp_path / "plots") == []


def test_rate_on_explicit_timestamps() -> None:
    rate = Rate(window_s=1.0, start=0.0)
    assert rate.rate(0.0) == 0.0
    for k in range(1, 11):  # 10 events per second for one second
        rate.observe(k / 10)
    assert rate.rate(1.0) == pytest.approx(10.0)
    rate.observe(1.5, n=4)  # a batch of 4
    # window (0.5, 1.5]: events at 0.6..1.0 (5) + 4 = 9 over 1 s
    assert rate.rate(1.5) == pytest.approx(9.0)
    assert rate.rate(3.0) == 0.0
    young = Rate(window_s=10.0, start=0.0)
    young.observe(1.0, n=6)
    assert young.rate(2.0) == pytest.approx(3.0)  # divides by elapsed time, not the window
    with pytest.raises(MetricsError, match="time went backwards"):
        young.observe(1.0)


def test_ewma_rate_tracks_a_steady_rate_and_decays() -> None:
    meter = EwmaRate(tau_s=2.0, start=0.0)
    for k in range(1, 101):  # 20 events/s for 5 s
        meter.observe(k * 0.05)
    assert meter.rate(5.0) == pytest.approx(20.0, rel=0.05)
    # no events for one time constant: the estimate decays by ~e
    assert meter.rate(7.0) == pytest.approx(20.0 / math.e, rel=0.1)
    with pytest.raises(MetricsError, match="time went backwards"):
        meter.rate(6.0)


def test_pool_timeline_replays_the_shifts_within_steps() -> None:
    from pivotflow.metrics_timeline import pool_timeline

    # step 1 ends at t=2 with pools {r: 2, t: 0}: a shift t -> r at 1.0 happened in it;
    # step 2 ends at t=4 with {r: 1, t: 1}: r -> t at 3.0 (and nothing else)
    records = [
        {"time_s": 2.0, "pools": {"r": 2, "t": 0},
         "shift_events": [{"time_s": 1.0, "from": "t", "to": "r"}]},
        {"time_s": 4.0, "pools": {"r": 1, "t": 1},
         "shift_events": [{"time_s": 3.0, "from": "r", "to": "t"}]},
    ]
    line = pool_timeline(records)
    assert line["r"] == ([0.0, 1.0, 3.0, 4.0], [1.0, 2.0, 1.0, 1.0])
    assert line["t"] == ([0.0, 1.0, 3.0, 4.0], [1.0, 0.0, 1.0, 1.0])


def test_smoothed_line_is_a_debiased_ema_that_bridges_gaps() -> None:
    from pivotflow.metrics_plots import ema, smoothing_span

    assert ema([1.0, 1.0, 1.0], span=9) == pytest.approx([1.0, 1.0, 1.0])  # no pull to 0
    out = ema([math.nan, 0.0, math.nan, 1.0], span=3)  # weight 0.5 on the newest
    assert math.isnan(out[0]) and out[1:3] == [0.0, 0.0]
    assert out[3] == pytest.approx(0.5 / 0.75)
    assert [smoothing_span(n) for n in (5, 200, 5000)] == [2, 20, 50]


def test_a_restarted_clock_and_segment_timed_shifts_go_on_one_axis() -> None:
    from pivotflow.metrics_timeline import continuous_times, placed_shifts, pool_timeline

    # step 3 resumed from step 2 (t=4) by a run from before time_s continued: its time and
    # its shift's time restarted at 0
    records = [
        {"step": 1, "time_s": 2.0, "pools": {"r": 1, "t": 1}},
        {"step": 2, "time_s": 4.0, "pools": {"r": 1, "t": 1}},
        {"step": 3, "time_s": 3.0, "pools": {"r": 2, "t": 0},
         "shift_events": [{"time_s": 1.0, "from": "t", "to": "r"}]},
    ]
    times = continuous_times(records)
    assert times == [2.0, 4.0, 7.0]
    resumes = [(2, 4.0)]
    assert placed_shifts(records, times, resumes) == [[], [], [(5.0, "t", "r")]]
    assert pool_timeline(records, resumes)["r"] == ([0.0, 5.0, 7.0], [1.0, 2.0, 2.0])
    # without the resume's start, a shift outside its step is drawn at the step's start
    assert placed_shifts(records, times, []) == [[], [], [(4.0, "t", "r")]]


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory: pytest.TempPathFactory, random_models: dict[str, Path]
                ) -> Path:
    """A real 3-step run of graphs/grpo_rule.py on a random model, resumed to 5 steps."""
    from pivotflow.run import run

    root = tmp_path_factory.mktemp("plots")
    graph = root / "grpo_rule_random.py"
    text = (Path(__file__).resolve().parents[1] / "graphs" / "grpo_rule.py").read_text()
    graph.write_text(text.replace("builtin:policy", str(random_models["policy"])))
    fast = ["live=false", "graph.groups_per_step=2", "graph.group_size=2"]
    run(graph, sets=fast, out=root / "run", steps=3, console=False)
    run(graph, out=root / "run", steps=5, console=False, resume=str(root / "run"))
    return root / "run"


@pytest.mark.timeout(240)
def test_plots_of_a_resumed_real_run_show_the_whole_run(resumed_run: Path) -> None:
    from pivotflow.metrics_timeline import continuous_times, pool_timeline, read_history
    from pivotflow.metrics_timeline import resume_points as resumes_of

    records = read_metrics(resumed_run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    times = continuous_times(records)
    assert times == [r["time_s"] for r in records]  # time_s already continues: kept as is
    assert times == sorted(times)
    resumes = resumes_of(records, times, read_history(resumed_run / "config.json"))
    assert resumes == [(3, records[2]["time_s"])]
    for ts, values in pool_timeline(records, resumes).values():
        assert ts[0] == 0.0 and ts[-1] == times[-1] and ts == sorted(ts)
        assert all(v >= 0 for v in values)
    written = make_plots(resumed_run / "metrics.jsonl", resumed_run / "replot")
    names = ["entropy_clip.png", "pools_queues.png", "response_lengths.png",
             "reward_accuracy.png", "step_path.png"]
    assert sorted(p.name for p in written) == names
    assert all(_is_png(p) for p in written)
    assert sorted(p.name for p in (resumed_run / "plots").iterdir()) == names  # the run's own
