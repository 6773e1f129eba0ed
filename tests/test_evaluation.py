"""Evaluation rounds (``--set eval_every=N``): the policy on held-out prompts through the graph's
own generate and judge stages, never trained, recorded in eval.jsonl, kept across a resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pivotflow.controller.evaluation import pass_at_k
from pivotflow.errors import ConfigError, GraphError
from pivotflow.metrics import read_metrics
from pivotflow.run import run

ROOT = Path(__file__).resolve().parents[1]
GENRM = ROOT / "graphs" / "grpo_genrm.py"


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """grpo_genrm for 6 steps, with rounds of 16 prompts every 3 steps, and without."""
    root = tmp_path_factory.mktemp("evaluated")
    run(GENRM, sets=["live=false", "eval_every=3", "eval_prompts=16"], out=root / "with",
        steps=6, console=False)
    run(GENRM, sets=["live=false"], out=root / "without", steps=6, console=False)
    return root / "with", root / "without"


def test_rounds_at_the_start_every_n_steps_and_the_end(evaluated: tuple[Path, Path]) -> None:
    out, _ = evaluated
    rounds = read_metrics(out / "eval.jsonl")
    assert [r["step"] for r in rounds] == [0, 3, 6]
    for r in rounds:
        assert r["prompts"] == 16 and r["samples_failed"] == 0 and r["temperature"] == 0.0
        assert 0.0 <= r["task_accuracy"] <= 1.0  # the task's rule, on every held-out prompt
        assert r["samples_per_prompt"] == 1 and r["task_pass_at_n"] == r["task_accuracy"]
        assert r["reward_mean"] is not None  # the graph's own judge scored them
        assert r["policy_version_min"] >= r["step"]  # generated on the version due, or newer
        assert r["response_len_mean"] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_rounds"] == 3 and summary["eval_step_last"] == 6
    assert summary["eval_task_accuracy_first"] == rounds[0]["task_accuracy"]


def test_evaluation_samples_are_never_trained(evaluated: tuple[Path, Path]) -> None:
    """The training run is the run without evaluation: the same groups, rewards and rule
    checks step for step (generated beside other sequences, the logprobs may differ in the
    last float bits), and the ledger counts no evaluation sample."""
    with_eval, without = (read_metrics(p / "metrics.jsonl") for p in evaluated)
    for a, b in zip(with_eval, without, strict=True):
        assert (a["group_ids"], a["task_accuracy"], a["reward_mean"], a["train_tokens"]) == (
            b["group_ids"], b["task_accuracy"], b["reward_mean"], b["train_tokens"])
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-3, abs=1e-6)
    ledgers = [json.loads((p / "summary.json").read_text())["ledger"] for p in evaluated]
    assert ledgers[0] == ledgers[1]
    assert "eval_rounds" not in json.loads((evaluated[1] / "summary.json").read_text())


def test_the_held_out_set_is_the_same_whatever_the_run_seed(
        evaluated: tuple[Path, Path], tmp_path: Path) -> None:
    """Greedy rounds of the same policy on the same held-out prompts: another RL seed (on the
    same built-in models) reads the same step-0 round to the digit."""
    run(GENRM, sets=["live=false", "eval_every=3", "eval_prompts=16", "seed=1",
                     "models_seed=0"], out=tmp_path / "seed1", steps=1, console=False)
    other = read_metrics(tmp_path / "seed1" / "eval.jsonl")[0]
    first = read_metrics(evaluated[0] / "eval.jsonl")[0]
    keys = ("task_accuracy", "reward_mean", "response_len_mean")
    assert {k: other[k] for k in keys} == {k: first[k] for k in keys}


def test_a_resumed_run_takes_each_round_once(tmp_path: Path) -> None:
    out = tmp_path / "run"
    sets = ["live=false", "eval_every=2", "eval_prompts=8", "checkpoint_every=2"]
    run(GENRM, sets=sets, out=out, steps=4, console=False)
    run(GENRM, sets=sets, out=out, steps=6, console=False, resume=str(out))
    assert [r["step"] for r in read_metrics(out / "eval.jsonl")] == [0, 2, 4, 6]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_rounds"] == 4 and summary["ledger"]["duplicates"] == 0


def test_several_samples_per_prompt_give_mean_and_pass_at_n(tmp_path: Path) -> None:
    """``eval_samples=4`` at temperature 1: each of 8 held-out prompts sampled 4 times;
    task_accuracy is the mean over the 32 (mean@4), task_pass_at_n the share of the 8 with one
    right, at least the mean."""
    out = tmp_path / "run"
    run(GENRM, sets=["live=false", "eval_every=1", "eval_prompts=8", "eval_samples=4",
                     "eval_temperature=1.0"], out=out, steps=1, console=False)
    rounds = read_metrics(out / "eval.jsonl")
    assert [r["step"] for r in rounds] == [0, 1]
    for r in rounds:
        assert (r["prompts"], r["samples_per_prompt"], r["samples_failed"]) == (8, 4, 0)
        assert (r["task_accuracy"] * 32) == pytest.approx(round(r["task_accuracy"] * 32))
        assert (r["task_pass_at_n"] * 8) == pytest.approx(round(r["task_pass_at_n"] * 8))
        assert r["task_accuracy"] <= r["task_pass_at_n"] <= 1.0
        # unbiased pass@k below n: pass@1 is mean@4 (every prompt has its 4), pass@2 between
        assert set(r["task_pass_at_k"]) == {"1", "2"}
        assert r["task_pass_at_k"]["1"] == pytest.approx(r["task_accuracy"])
        assert r["task_accuracy"] <= r["task_pass_at_k"]["2"] <= r["task_pass_at_n"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_task_pass_at_n_last"] == rounds[-1]["task_pass_at_n"]


def test_zero_steps_evaluate_the_policy_and_train_nothing(tmp_path: Path) -> None:
    """``--steps 0 --set eval_every=1`` (verl's val_only): one round at step 0, no training
    prompt admitted, no step record, no new policy folder; without eval_every, an error."""
    out = tmp_path / "eval_only"
    result = run(GENRM, sets=["live=false", "eval_every=1", "eval_prompts=8"], out=out, steps=0,
                 console=False)
    assert [r["step"] for r in read_metrics(out / "eval.jsonl")] == [0]
    assert result.summary["steps"] == 0 and result.summary["ledger"]["prompts_in"] == 0
    assert result.summary["eval_task_accuracy_last"] is not None
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints" / "policy").exists()
    with pytest.raises(ConfigError, match="steps 0: trains nothing; with --set eval_every=1"):
        run(GENRM, sets=["live=false"], out=tmp_path / "none", steps=0, console=False)


FILE_GRAPH = '''
from pivotflow.graph import Graph
from pivotflow.rl.group_fns import grpo_advantage
from pivotflow.tasks.arithmetic import check_answer

def reward(completion, answer, group_id, prompt_id, **_):
    if group_id < 0 and prompt_id == 1:  # (an evaluation sample: the second held-out row)
        raise ValueError("no reward for this one")
    return float(check_answer(answer, completion))

def build(config):
    g = Graph("from_files")
    g.model("policy", source=%(policy)r)
    g.pool("rollout", workers=1)
    g.pool("trainer", workers=1)
    src = g.source("prompts", path="train.jsonl", eval_path=%(eval_path)r, group_size=2,
                   groups_per_step=2, check_with="arithmetic")
    gen = g.generate("rollout", model="policy", pool="rollout", max_tokens=4)
    rew = g.map("reward", reward, writes=["reward"], on_error="skip")
    adv = g.group("advantage", grpo_advantage, writes=["advantage"])
    g.chain(src, gen, rew, adv, g.train("train", model="policy", pool="trainer"))
    return g
'''


def file_graph(tmp_path: Path, policy: Path, eval_path: str | None = "held_out.jsonl") -> Path:
    for name, pairs in (("train.jsonl", [(a, 20) for a in range(10, 16)]),
                        ("held_out.jsonl", [(a, 30) for a in range(40, 43)])):
        (tmp_path / name).write_text("".join(
            json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a, b in pairs))
    (tmp_path / "other.jsonl").write_text(json.dumps({"prompt": "1+1=", "answer": "2",
                                                      "level": 1}) + "\n")
    graph = tmp_path / "graph.py"
    graph.write_text(FILE_GRAPH % {"policy": str(policy), "eval_path": eval_path})
    return graph


def test_a_prompt_file_source_evaluates_on_its_eval_path(
        tmp_path: Path, random_models: dict[str, Path]) -> None:
    """A file source's rounds read its ``eval_path`` rows; a stage function that fails on one
    of them (on_error=skip) counts it failed and the round ends without it."""
    graph = file_graph(tmp_path, random_models["policy"])
    run(graph, sets=["live=false", "planner=static", "eval_every=2"], out=tmp_path / "out",
        steps=2, console=False)
    rounds = read_metrics(tmp_path / "out" / "eval.jsonl")
    assert [r["step"] for r in rounds] == [0, 2]
    for r in rounds:
        assert r["prompts"] == 3 and r["samples_failed"] == 1
        assert r["task_accuracy"] is not None  # the arithmetic rule, on the two that came back


def test_bad_evaluation_settings_are_one_line_errors(
        tmp_path: Path, random_models: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match=r"eval_every=-1 .*eval_every must be >= 0"):
        run(GENRM, sets=["live=false", "eval_every=-1"], out=tmp_path / "a", steps=1,
            console=False)
    with pytest.raises(ConfigError, match=r"eval_samples=4: .*needs eval_temperature > 0"):
        run(GENRM, sets=["live=false", "eval_every=1", "eval_samples=4"], out=tmp_path / "a2",
            steps=1, console=False)
    graph = file_graph(tmp_path, random_models["policy"], eval_path=None)
    with pytest.raises(GraphError, match="eval_every needs held-out prompts: give the source "
                                         "eval_path=FILE") as err:
        run(graph, sets=["live=false", "eval_every=2"], out=tmp_path / "b", steps=1,
            console=False)
    assert "\n" not in str(err.value)
    graph = file_graph(tmp_path, random_models["policy"], eval_path="other.jsonl")
    with pytest.raises(GraphError, match=r"eval_path other.jsonl has the columns \['level'\]"):
        run(graph, sets=["live=false"], out=tmp_path / "c", steps=1, console=False)


def test_every_key_of_eval_records_is_documented(evaluated: tuple[Path, Path]) -> None:
    from test_records_doc import assert_documented

    out, _ = evaluated
    assert_documented({k for r in read_metrics(out / "eval.jsonl") for k in r}, "eval.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    assert_documented({k for k in summary if k.startswith("eval")}, "summary.json")


def test_pass_at_k_is_the_unbiased_estimate() -> None:
    """1 - C(n-c, k)/C(n, k) per prompt, averaged; k = n is "any right", k = 1 the share right;
    a prompt with fewer than k samples checked is left out, and none left gives None."""
    assert pass_at_k([(4, 1)], 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k([(4, 1), (4, 0)], 2) == pytest.approx(0.25)
    assert pass_at_k([(4, 3)], 1) == pytest.approx(0.75)
    assert pass_at_k([(4, 1), (4, 0), (4, 4)], 4) == pytest.approx(2 / 3)
    assert pass_at_k([(8, 2)], 4) == pytest.approx(1 - 15 / 70)  # C(6,4) / C(8,4)
    assert pass_at_k([(2, 2), (4, 0)], 4) == pytest.approx(0.0)
    assert pass_at_k([(2, 1)], 4) is None
