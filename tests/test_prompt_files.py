"""A run whose prompts come from a Parquet file: its columns reach the stage functions."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pivotflow.metrics import read_metrics
from pivotflow.run import run

GRAPH = '''
from pivotflow.graph import Graph
from pivotflow.rl.group_fns import grpo_advantage
from pivotflow.rl.reward_adapters import trl_reward
from pivotflow.tasks.arithmetic import check_answer

def reward(completion, answer, weight, **_):
    # the dataset's own column, read by name as TRL passes columns to reward functions
    return weight + float(check_answer(answer, completion))


# the same reward as two TRL reward functions, each called on a prompt's group
def weight_reward(prompts, completions, weight, log_metric, **_):
    log_metric("group_size", len(completions))  # TRL's log_metric: into logged_metrics
    return list(weight)


def exact_reward(prompts, completions, answer, trainer_state, log_extra, **_):
    # TRL's log_extra: a column of its completions table, here a field of each sample
    progress = trainer_state.global_step / trainer_state.max_steps  # (a curriculum's)
    log_extra("progress", [progress] * len(completions))
    return [float(check_answer(a, c)) for a, c in zip(answer, completions)]

def build(config):
    g = Graph("from_parquet")
    g.model("policy", source=%(policy)r)
    g.pool("rollout", workers=1)
    g.pool("trainer", workers=1)
    src = g.source("prompts", path="prompts.parquet", prompt_key="question",
                   answer_key="solution", group_size=4, groups_per_step=2,
                   check_with="arithmetic")
    gen = g.generate("rollout", model="policy", pool="rollout", max_tokens=4)
    rew = %(reward_stage)s
    adv = g.group("advantage", grpo_advantage, writes=["advantage"])
    g.chain(src, gen, rew, adv, g.train("train", model="policy", pool="trainer"))
    return g
'''


MAP_REWARD = 'g.map("reward", reward, writes=["reward"])'
TRL_REWARD = ('g.group("reward", trl_reward([weight_reward, exact_reward], group=True, '
              'each=True, extra=("progress",)), writes=["reward", "reward_weight_reward", '
              '"reward_exact_reward", "progress"])')


def graph_with_table(tmp_path: Path, random_models: dict[str, Path],
                     distinct: bool = False, reward_stage: str = MAP_REWARD) -> Path:
    """12 rows; each weight 2.0, or with ``distinct`` the row's number (it names the row).
    The reward is the weight plus 1 where the arithmetic rule says right, from a map stage or
    from two TRL reward functions on each group (``TRL_REWARD``)."""
    rows = [{"question": f"{a}+{b}=", "solution": a + b, "tags": ["add", "2d"]}
            for a in range(10, 14) for b in range(20, 23)]
    for i, row in enumerate(rows):
        row["weight"] = float(i) if distinct else 2.0
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "prompts.parquet")
    graph = tmp_path / "graph.py"  # the file's relative path is found beside the graph file
    graph.write_text(GRAPH % {"policy": str(random_models["policy"]),
                              "reward_stage": reward_stage})
    return graph


def test_a_parquet_prompt_file_feeds_the_run(tmp_path: Path,
                                             random_models: dict[str, Path]) -> None:
    """...and into TRL reward functions, called on each group and summed, each function's
    mean logged as TRL logs it."""
    graph = graph_with_table(tmp_path, random_models, reward_stage=TRL_REWARD)
    result = run(graph, sets=["live=false", "planner=static"], out=tmp_path / "out",
                 steps=3, console=False)
    assert result.summary["ledger"]["groups_trained"] == 6
    for rec in read_metrics(tmp_path / "out" / "metrics.jsonl"):
        # the column's 2.0 on every sample, plus the exact rule's 1.0 where it is right
        assert rec["reward_mean"] == pytest.approx(2.0 + rec["task_accuracy"])
        assert rec["task_accuracy"] is not None  # checked by the arithmetic rule
        # (staleness 0: step N's samples were drawn by version N - 1, of 3 steps)
        assert rec["field_means"] == pytest.approx({"reward_weight_reward": 2.0,
                                                    "reward_exact_reward": rec["task_accuracy"],
                                                    "progress": (rec["step"] - 1) / 3})
        # each step's groups are rewarded after the step before it is recorded (staleness 0)
        assert rec["logged_metrics"] == {"group_size": 4.0}
    # and each logged sample shows each function's reward, as TRL's completions table does
    lines = read_metrics(tmp_path / "out" / "samples.jsonl")
    assert lines and all(line["stage_fields"] == pytest.approx({
        "reward_weight_reward": 2.0, "reward_exact_reward": float(line["correct"]),
        "progress": line["versions_min"] / 3}) for line in lines)


def test_a_run_on_a_prompt_file_resumes_where_it_stopped(tmp_path: Path,
                                                         random_models: dict[str, Path]) -> None:
    graph = graph_with_table(tmp_path, random_models, distinct=True)
    sets = ["live=false", "planner=static", "checkpoint_every=2"]
    out = tmp_path / "out"
    run(graph, sets=sets, out=out, steps=3, console=False)
    result = run(graph, sets=sets, out=out, steps=8, console=False, resume="auto")
    assert result.summary["ledger"]["groups_trained"] == 16
    assert result.summary["ledger"]["lost"] == 0 and result.summary["ledger"]["duplicates"] == 0
    # 16 groups over a 12-row file, shuffled per pass: the same rows step by step as a run
    # that never stopped (a reward is its row's weight, plus 1 where the rule says right)
    straight = run(graph, sets=sets, out=tmp_path / "straight", steps=8, console=False)

    def rows_per_step(path: Path) -> list[float]:
        return [r["reward_mean"] - r["task_accuracy"] for r in read_metrics(path)]

    resumed = rows_per_step(out / "metrics.jsonl")
    assert resumed == pytest.approx(rows_per_step(straight.out / "metrics.jsonl"))
    assert len(set(resumed)) >= 4  # the steps hold different rows: the check tells them apart


def test_message_prompts_need_a_model_with_a_chat_template(
        tmp_path: Path, random_models: dict[str, Path]) -> None:
    """Refused before any worker starts, naming the source, the file and the model folder."""
    import shutil

    from pivotflow.errors import GraphError

    bare = tmp_path / "no_template"
    shutil.copytree(random_models["policy"], bare)
    (bare / "chat_template.jinja").unlink()
    (tmp_path / "prompts.jsonl").write_text(
        '{"question": [{"role": "user", "content": "1+2="}], "solution": 3, "weight": 1.0}\n')
    graph = tmp_path / "graph.py"
    graph.write_text((GRAPH % {"policy": str(bare), "reward_stage": MAP_REWARD})
                     .replace("prompts.parquet", "prompts.jsonl"))
    with pytest.raises(GraphError, match=rf"source 'prompts' at .*graph.py:\d+: "
                                         rf"{tmp_path / 'prompts.jsonl'} holds chat messages, "
                                         rf"but the tokenizer of model 'policy' \({bare}\) has "
                                         "no chat template"):
        run(graph, sets=["live=false"], out=tmp_path / "out", steps=1, console=False)
    assert not (tmp_path / "out" / "logs").exists() or not any((tmp_path / "out" / "logs")
                                                               .iterdir())  # no worker ran
