"""``samples.jsonl`` holds what it says, on real runs of graphs/grpo_rule.py on a random model:
N samples a step with their prompt, response, reward, advantage and policy versions, the reward
being what the graph's reward function gives for that response; 0 writes no file; a resume
moves the lines after its checkpoint to samples.superseded.jsonl, as it does the metrics."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from pivotflow.errors import ConfigError
from pivotflow.metrics import read_metrics
from pivotflow.run import run
from pivotflow.sinks.samples import SAMPLE_KEYS, pick

FAST = ["live=false", "graph.groups_per_step=2", "graph.group_size=2", "checkpoint_every=1"]
ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def rule_graph(tmp_path_factory: pytest.TempPathFactory, random_models: dict[str, Path]) -> Path:
    """graphs/grpo_rule.py on a random model (test_sinks.py uses it too)."""
    path = tmp_path_factory.mktemp("graph") / "grpo_rule_random.py"
    text = (ROOT / "graphs" / "grpo_rule.py").read_text()
    path.write_text(text.replace("builtin:policy", str(random_models["policy"])))
    return path


@pytest.fixture(scope="module")
def three_steps(rule_graph: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("samples") / "run"
    run(rule_graph, sets=[*FAST, "log_samples=3"], out=out, steps=3, console=False)
    return out


def test_each_step_logs_its_samples_whole(three_steps: Path, rule_graph: Path) -> None:
    lines = read_metrics(three_steps / "samples.jsonl")
    metrics = read_metrics(three_steps / "metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    spec = importlib.util.spec_from_file_location("rule_graph", rule_graph)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    for line in lines:
        assert set(line) <= set(SAMPLE_KEYS)
        step = metrics[line["step"] - 1]
        assert line["group_id"] in step["group_ids"]  # a sample that step trained
        assert line["policy_version"] == step["policy_version"]
        assert line["prompt"].strip() and isinstance(line["response"], str)
        # the reward is the graph's own function of this very response
        assert line["reward"] == module.exact_reward(line["answer"], line["response"])
        assert isinstance(line["advantage"], float)
        assert 0 <= line["versions_min"] <= line["versions_max"] < line["policy_version"]
        assert line["response_tokens"] >= 1 and line["finish_reason"] in ("stop", "length")
        assert "turns" not in line  # a single-turn graph
    for step in (1, 2, 3):  # round robin: both groups of the step show before a group's second
        groups = [line["group_id"] for line in lines if line["step"] == step]
        assert len(set(groups[:2])) == 2
    # no sample logged twice
    by_sample = {(line["group_id"], line["sample_id"]): line for line in lines}
    assert len(by_sample) == len(lines)


def test_zero_writes_no_file_and_a_bad_count_is_refused(rule_graph: Path,
                                                         tmp_path: Path) -> None:
    run(rule_graph, sets=[*FAST, "log_samples=0"], out=tmp_path / "off", steps=1,
        console=False)
    assert not (tmp_path / "off" / "samples.jsonl").exists()
    assert (tmp_path / "off" / "metrics.jsonl").exists()
    with pytest.raises(ConfigError, match=r"^--set log_samples=-2: give a count") as err:
        run(rule_graph, sets=[*FAST, "log_samples=-2"], out=tmp_path / "bad", steps=1,
            console=False)
    assert "\n" not in str(err.value) and not (tmp_path / "bad").exists()
    with pytest.raises(ConfigError, match=r"log_samples"):
        run(rule_graph, sets=[*FAST, "log_samples=many"], out=tmp_path / "bad", steps=1,
            console=False)


def test_a_resume_supersedes_the_lines_after_its_checkpoint(three_steps: Path, rule_graph: Path,
                                                            tmp_path: Path) -> None:
    out = tmp_path / "run"
    shutil.copytree(three_steps, out)
    before = read_metrics(out / "samples.jsonl")
    shutil.rmtree(out / "checkpoints" / "step-000003")  # resume from step 2
    (out / "checkpoints" / "LATEST").write_text("step-000002")
    run(rule_graph, out=out, resume=str(out), steps=4, console=False)
    after = read_metrics(out / "samples.jsonl")
    assert after[:6] == before[:6]  # steps 1-2 as they were
    assert [line["step"] for line in after[6:]] == [3, 3, 3, 4, 4, 4]
    assert read_metrics(out / "samples.superseded.jsonl") == before[6:]  # kept, not lost


def test_pick_takes_one_of_each_group_in_turn() -> None:
    batch = [["a0", "a1", "a2"], ["b0", "b1"], ["c0"]]
    assert pick(batch, 4) == ["a0", "b0", "c0", "a1"]
    assert pick(batch, -1) == ["a0", "a1", "a2", "b0", "b1", "c0"]
    assert pick(batch, 0) == [] and pick(batch, 99) == ["a0", "b0", "c0", "a1", "b1", "a2"]


@pytest.mark.timeout(600)
def test_an_agentic_run_logs_turns_tool_calls_and_the_verdict(tmp_path: Path) -> None:
    """graphs/agentic_tools.py (tool calls in a real sandboxed pool, a GenRM judge), every
    sample logged: the lines' turns and calls average to the step's own figures."""
    out = tmp_path / "run"
    run(ROOT / "graphs" / "agentic_tools.py", sets=["live=false", "graph.groups_per_step=2",
                                                    "log_samples=-1"],
        steps=2, out=out, console=False)
    lines = read_metrics(out / "samples.jsonl")
    for step in read_metrics(out / "metrics.jsonl"):
        mine = [line for line in lines if line["step"] == step["step"]]
        assert len(mine) == step["samples"]
        assert sum(line["turns"] for line in mine) / len(mine) == pytest.approx(
            step["turns_mean"])
        assert sum(line["tool_calls"] for line in mine) / len(mine) == pytest.approx(
            step["tool_calls_per_sample"])
        assert sum(line["tool_errors"] for line in mine) == step["tool_errors"]
    for line in lines:
        assert isinstance(line["verdict"], str) and "judge_failed" in line
        assert isinstance(line["trajectory"], str) and line["turns"] >= 1
        assert len(line["trajectory"]) >= len(line["response"])  # every turn, the last one too
