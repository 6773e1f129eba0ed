"""``--resume`` never loses work, on real runs: a finished run is extended; a resume that fails
leaves the earlier records byte for byte; a changed graph or group size is refused with the
differences listed (or accepted knowingly, and recorded); a damaged newest checkpoint is passed
over for the one before it, saying so; a manifest that disagrees with its state stops the
resume before any worker starts."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from pivotflow.cli import main
from pivotflow.errors import CheckpointError, ConfigError, WorkerError
from pivotflow.metrics import read_metrics
from pivotflow.resume import newest_run
from pivotflow.run import run

FAST = ["live=false", "graph.groups_per_step=2", "graph.group_size=2", "checkpoint_every=1"]
ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory,
             random_models: dict[str, Path]) -> tuple[Path, Path]:
    """(graph file, run folder) of a finished 2-step run of graphs/grpo_rule.py on a random
    model, with a checkpoint after each step; tests resume copies of it."""
    root = tmp_path_factory.mktemp("finished")
    graph = root / "grpo_rule_random.py"
    text = (ROOT / "graphs" / "grpo_rule.py").read_text()
    graph.write_text(text.replace("builtin:policy", str(random_models["policy"])))
    run(graph, sets=FAST, out=root / "run", steps=2, console=False)
    return graph, root / "run"


def copy_of(finished: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    graph, out = finished
    shutil.copytree(out, tmp_path / "run")
    return graph, tmp_path / "run"


def files(out: Path) -> dict[str, bytes]:
    """Every file of a run folder, by its path (the records byte for byte)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file()}


def group_ids(out: Path) -> list[int]:
    return [g for r in read_metrics(out / "metrics.jsonl") for g in r["group_ids"]]


def test_a_finished_run_is_extended_and_its_records_cover_the_whole_run(
        finished: tuple[Path, Path], tmp_path: Path) -> None:
    graph, out = copy_of(finished, tmp_path)
    before = files(out)
    assert (out / "checkpoints" / "LATEST").read_text() == "step-000002"  # the run's end
    result = run(graph, out=out, steps=4, console=False, resume=str(out))  # settings inherited
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert sorted(group_ids(out)) == list(range(8))  # every prompt trained exactly once
    assert (out / "metrics.jsonl").read_bytes().startswith(before["metrics.jsonl"])  # appended
    assert records[2]["time_s"] >= records[1]["time_s"]  # one clock across the resume
    for r in records:  # each step's path (records.step_path), on that clock too
        path = [r["admitted_s"], *r["stage_done_s"].values(), r["train_ready_s"],
                r["train_started_s"], r["time_s"]]
        assert len(path) == 5 and path == sorted(path), (r["step"], path)
    # the first run admitted no group of steps 3-4 (it trained to 2): the resume did, later
    assert records[2]["admitted_s"] >= records[1]["time_s"]
    s = result.summary
    assert s["steps"] == 4 and s["ledger"]["groups_trained"] == 8 == s["ledger"]["prompts_in"]
    assert s["resumed_from_step"] == 2 and s["segments"] == 2
    assert s["wall_s"] > records[1]["time_s"]  # the first part's time counts
    config = json.loads((out / "config.json").read_text())
    assert config["steps"] == 4 and config["graph"]["group_size"] == 2
    [first, second] = config["history"]
    assert first["from_step"] == 0 and second["from_step"] == 2
    assert second["checkpoint"] == "step-000002" and second["changes"] == ["steps: 2 -> 4"]
    assert (out / "checkpoints" / "LATEST").read_text() == "step-000004"
    assert (out / "checkpoints" / "policy" / "version").read_text() == "4"
    # the first part's worker logs stay; the resume's have their own folder
    assert all(before[k] == (out / k).read_bytes() for k in before if k.startswith("logs/"))
    assert list((out / "logs" / "resume-1").glob("*.log"))


def test_a_failed_resume_leaves_the_records_byte_for_byte(
        finished: tuple[Path, Path], tmp_path: Path) -> None:
    graph, out = copy_of(finished, tmp_path)
    before = files(out)
    with pytest.raises(WorkerError, match="vllm is not installed"):  # fails once workers run
        run(graph, sets=["engine=vllm"], out=out, steps=4, console=False, resume=str(out))
    after = {k: v for k, v in files(out).items() if not k.startswith("logs/resume-1/")}
    assert after == before  # metrics, config, summary, shifts, plots, checkpoints, logs
    assert list((out / "logs" / "resume-1").glob("*.log"))  # it did start its workers


def test_a_changed_graph_or_group_size_is_refused_with_the_differences(
        finished: tuple[Path, Path], tmp_path: Path) -> None:
    graph, out = copy_of(finished, tmp_path)
    before = files(out)
    with pytest.raises(ConfigError, match=r"graph\.group_size: 2 -> 4.*--accept-changes"):
        run(graph, sets=["graph.group_size=4"], out=out, steps=4, console=False,
            resume=str(out))
    edited = tmp_path / "edited.py"
    edited.write_text(graph.read_text() + "\n# edited\n")
    with pytest.raises(ConfigError, match=r"graph file: .*grpo_rule_random\.py \(sha256 "
                                          r"\w+\) -> .*edited\.py"):
        run(edited, out=out, steps=4, console=False, resume=str(out))
    assert files(out) == before  # refused before anything started


def test_an_accepted_change_is_recorded_in_the_config_history(
        finished: tuple[Path, Path], tmp_path: Path) -> None:
    graph, out = copy_of(finished, tmp_path)
    run(graph, sets=["graph.lr=2e-05"], out=out, steps=3, console=False, resume=str(out),
        accept_changes=True)
    config = json.loads((out / "config.json").read_text())
    assert config["graph"]["lr"] == 2e-05
    assert config["history"][-1]["accepted_changes"] == ["graph.lr: 1e-05 -> 2e-05"]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]


def test_a_flipped_byte_is_caught_and_the_checkpoint_before_is_used(
        finished: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    graph, out = copy_of(finished, tmp_path)
    weights = out / "checkpoints" / "step-000002" / "policy" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, in the middle of a tensor: still loads
    weights.write_bytes(bytes(data))
    old_step2 = read_metrics(out / "metrics.jsonl")[1]
    with caplog.at_level(logging.WARNING, logger="pivotflow.run"):
        run(graph, out=out, steps=3, console=False, resume=str(out))
    assert "model.safetensors is damaged" in caplog.text  # said so
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]  # step 2 taken again, from step 1
    assert sorted(group_ids(out)) == list(range(6))
    assert read_metrics(out / "metrics.superseded.jsonl") == [old_step2]  # kept, not lost
    entry = json.loads((out / "config.json").read_text())["history"][-1]
    assert entry["checkpoint"] == "step-000001" and "damaged" in entry["passed_over"][0]


def test_a_manifest_that_disagrees_with_its_state_is_an_error_before_any_worker_starts(
        finished: tuple[Path, Path], tmp_path: Path) -> None:
    graph, out = copy_of(finished, tmp_path)
    shutil.rmtree(out / "checkpoints" / "step-000001")  # nothing to fall back to
    manifest = out / "checkpoints" / "step-000002" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"step": 2', '"step": 5'))
    before = files(out)
    with pytest.raises(CheckpointError, match="manifest says step 5, its controller state "
                                              "version 2"):
        run(graph, out=out, steps=8, console=False, resume=str(out))
    assert files(out) == before and not (out / "logs" / "resume-1").exists()  # no worker


def test_resume_auto_without_out_finds_the_newest_run_of_the_graph_or_says_none(
        finished: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    graph, out = finished
    monkeypatch.chdir(tmp_path)
    code = main(["run", str(graph), "--resume", "auto"])
    assert code == 2 and "no run of graph 'grpo_rule' under" in capsys.readouterr().err
    runs = tmp_path / "runs"
    shutil.copytree(out, runs / "grpo_rule-20260101-000000")
    shutil.copytree(out, runs / "grpo_rule-20260102-000000")
    shutil.copytree(out, runs / "grpo_rule_other-20270101-000000")  # another graph's
    (runs / "grpo_rule-20260103-000000").mkdir()  # newer, but without a checkpoint
    assert newest_run(runs, "grpo_rule") == runs / "grpo_rule-20260102-000000"


def test_steps_0_and_steps_not_above_the_checkpoint_name_steps(
        finished: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    graph, out = copy_of(finished, tmp_path)
    assert main(["run", str(graph), "--steps", "0"]) == 2
    assert "steps 0: trains nothing" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="checkpoint is at step 2 .* give --steps N above 2"):
        run(graph, out=out, console=False, resume=str(out))  # finished: nothing to continue


def test_an_unreadable_config_is_a_one_line_error_naming_it(
        finished: tuple[Path, Path], tmp_path: Path) -> None:
    graph, out = copy_of(finished, tmp_path)
    (out / "config.json").write_text('{"steps": 2,')  # cut short
    before = files(out)
    with pytest.raises(ConfigError, match=rf"--resume {out}: {out / 'config.json'}: cannot "
                                          "read JSON"):
        run(graph, out=out, steps=4, console=False, resume=str(out))
    assert files(out) == before
