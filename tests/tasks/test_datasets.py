"""Prompt files (JSONL, Parquet): rows checked, other columns kept as fields, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pivotflow.errors import GraphError, TaskError
from pivotflow.graph import Graph
from pivotflow.graph_check import validate
from pivotflow.rl.group_fns import grpo_advantage
from pivotflow.run_models import ProblemStream
from pivotflow.tasks.datasets import load_prompt_file

ROWS = [{"prompt": f"{i}+1=", "answer": str(i + 1), "level": i % 3, "tags": ["add"]}
        for i in range(10)]


def jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_and_parquet_give_the_same_rows(tmp_path: Path) -> None:
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "p.parquet")
    a = load_prompt_file(jsonl(tmp_path / "p.jsonl", ROWS))
    b = load_prompt_file(tmp_path / "p.parquet")
    assert a.columns == b.columns == ("level", "tags")
    assert a.rows == b.rows
    assert a.rows[4] == {"prompt": "4+1=", "answer": "5", "level": 1, "tags": ["add"]}


def test_keys_name_the_columns_and_numbers_are_answers(tmp_path: Path) -> None:
    rows = [{"question": "2+2=", "solution": 4, "id": 7}]
    table = load_prompt_file(jsonl(tmp_path / "q.jsonl", rows), prompt_key="question",
                             answer_key="solution")
    assert table.rows == [{"prompt": "2+2=", "answer": "4", "id": 7}]
    # prompts without an answer (a judge that needs no reference)
    table = load_prompt_file(tmp_path / "q.jsonl", prompt_key="question", answer_key=None)
    assert table.rows[0]["answer"] is None and table.columns == ("id", "solution")


def test_verl_s_own_layout_reads_with_a_dotted_answer_key(tmp_path: Path) -> None:
    """verl's preprocessed datasets (examples/data_preprocess/gsm8k.py) keep the answer in a
    struct column: ``reward_model: {style, ground_truth}``, beside ``extra_info``."""
    rows = [{"data_source": "openai/gsm8k", "question": "Natalia sold 48 clips...",
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": "72"},
             "extra_info": {"split": "train", "index": i}} for i in range(2)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    table = load_prompt_file(tmp_path / "train.parquet", prompt_key="question",
                             answer_key="reward_model.ground_truth")
    assert table.columns == ("ability", "data_source", "extra_info", "reward_model")
    assert table.rows[1]["answer"] == "72"
    assert table.rows[1]["extra_info"] == {"split": "train", "index": 1}
    assert table.rows[1]["reward_model"]["style"] == "rule"  # (the column stays a field)
    for key, missing in (("reward_model.truth", "no 'truth' in 'reward_model'"),
                         ("reward.ground_truth", "no such column"),
                         ("reward_model", "dict")):
        with pytest.raises(TaskError, match=rf"^.*train.parquet:row 1: the answer column "
                                            rf"'{key}' must be a string or a number "
                                            rf"\({missing}\); give answer_key=None"):
            load_prompt_file(tmp_path / "train.parquet", prompt_key="question", answer_key=key)


@pytest.mark.parametrize(
    ("lines", "error"),
    [
        (['{"prompt": "1+1=", "answer": "2"}', "{not json"], r"q.jsonl:line 2: not JSON"),
        (['["1+1=", "2"]'], r"q.jsonl:line 1: a row is a JSON object, got list"),
        (['{"answer": "2"}'], r"line 1: the prompt column 'prompt' must be a non-empty string "
                              r"\(no such column"),
        (['{"prompt": "", "answer": "2"}'], r"must be a non-empty string \(str ''"),
        (['{"prompt": "1+1=", "answer": true}'], r"the answer column 'answer' must be a string"),
        (['{"prompt": "1+1=", "answer": "2", "a": 1}', '{"prompt": "x", "answer": "2"}'],
         r"q.jsonl:line 2: columns differ from the first row's \(extra \[\], missing \['a'\]\)"),
        (['{"prompt": "1+1=", "answer": "2", "_seen": 1}'], r"column '_seen' cannot be a sample"),
        (['{"prompt": "1+1=", "answer": "2", "my col": 1}'], r"column 'my col' cannot be"),
        (['{"prompt": "1+1=", "answer": "2", "reward": 1}'],
         r"column 'reward' is a field the runtime writes"),
        ([""], r"q.jsonl: no rows"),
    ],
)
def test_bad_rows_name_the_file_and_line(tmp_path: Path, lines: list[str], error: str) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TaskError, match=error):
        load_prompt_file(path, reserved=frozenset({"reward"}))


def test_bad_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"prompt files are .jsonl or .parquet, not '.csv'"):
        load_prompt_file(tmp_path / "p.csv")
    with pytest.raises(TaskError, match=r"p.jsonl: no such prompt file"):
        load_prompt_file(tmp_path / "p.jsonl")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(TaskError, match=r"bad.parquet: not a readable Parquet file"):
        load_prompt_file(tmp_path / "bad.parquet")


def test_a_graph_reads_the_columns_and_a_missing_one_names_the_stage(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "p.jsonl", ROWS)

    def weighted(completion: str, answer: str, level: int, **_: object) -> float:
        return float(completion == answer) * level

    def source_and_reward(fn: object) -> Graph:
        g = Graph("t")
        g.model("policy", source="builtin:policy")
        g.pool("rollout", workers=1)
        g.pool("trainer", workers=1)
        src = g.source("prompts", path=str(path))
        gen = g.generate("rollout", model="policy", pool="rollout")
        rew = g.map("reward", fn, writes=["reward"])
        adv = g.group("advantage", grpo_advantage, writes=["advantage"])
        g.chain(src, gen, rew, adv, g.train("train", model="policy", pool="trainer"))
        return g

    graph = source_and_reward(weighted)
    validate(graph)
    assert {"level", "tags"} <= graph.nodes["prompts"].writes

    def unknown(completion: str, difficulty: int, **_: object) -> float:
        return 0.0

    with pytest.raises(GraphError, match=r"node 'reward' at .* reads \['difficulty'\]"):
        validate(source_and_reward(unknown))
    # a bad file fails as the graph is built, naming the source and the graph file's line
    with pytest.raises(GraphError, match=r"source 'prompts' at .*test_datasets.py:\d+: .*no such"):
        Graph("t").source("prompts", path=str(tmp_path / "missing.jsonl"))


def test_each_pass_over_a_file_is_a_new_seeded_order_and_resumes_by_cursor(
    tmp_path: Path,
) -> None:
    g = Graph("t")
    node = g.source("prompts", path=str(jsonl(tmp_path / "p.jsonl", ROWS)))
    stream = ProblemStream(node, seed=3)
    drawn = [stream.next().prompt for _ in range(25)]
    prompts = [r["prompt"] for r in ROWS]
    assert sorted(drawn[:10]) == sorted(prompts) == sorted(drawn[10:20])  # every row once a pass
    assert drawn[:10] != prompts and drawn[:10] != drawn[10:20]
    resumed = ProblemStream(node, seed=3)
    resumed.cursor = 13
    assert [resumed.next().prompt for _ in range(12)] == drawn[13:]
    problem = ProblemStream(node, seed=3).next()
    assert set(problem.meta) == {"level", "tags"}
    ordered = ProblemStream(g.source("p2", path=str(tmp_path / "p.jsonl"), shuffle=False), seed=3)
    assert [ordered.next().prompt for _ in range(11)] == [*prompts, prompts[0]]
