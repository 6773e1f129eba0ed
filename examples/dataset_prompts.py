"""Prompts from your own dataset file: a Parquet (or JSONL) table whose columns reach the reward.

prompts (data.parquet) -> rollout -> reward (by each row's data_source) -> GRPO -> train

    python examples/dataset_prompts.py [--steps 30] [--out runs/dataset]
    pivotflow run examples/dataset_prompts.py --set graph.data=my.parquet

The table is laid out as verl's preprocessed datasets are (``data_preprocess/gsm8k.py``):
``data_source``, the prompt, ``ability``, ``reward_model: {"style": "rule", "ground_truth":
...}`` and ``extra_info`` (here the row's split, index and ``carry``: whether the sum carries).
``answer_key="reward_model.ground_truth"`` reaches into the struct for the ``answer`` field,
and the reward is a verl ``compute_score(data_source, solution_str, ground_truth, extra_info)``
wrapped unchanged by ``verl_reward``, dispatching on ``data_source`` as verl's own does. Every
column is a sample field too, read by name. (verl's prompt column holds chat messages; the
built-in policy has no chat template, so this one is the plain ``question``: with a Hugging Face
model, ``prompt_key="prompt"`` takes the messages as they are.) ``main`` writes a table of 512
sums first; a file of your own only needs the columns the graph reads.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from pivotflow.graph import Graph
from pivotflow.rl.group_fns import grpo_advantage
from pivotflow.rl.reward_adapters import verl_reward
from pivotflow.tasks.arithmetic import check_answer

DEFAULTS = {"data": "data.parquet", "group_size": 8, "groups_per_step": 8, "lr": 1e-5}

SCORERS = {"arithmetic": check_answer}  # data_source -> its exact rule


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict | None = None) -> dict:
    """verl's custom reward signature: 1.0 when the row's own checker accepts the response,
    with the row's ``carry`` beside it (verl logs a dict's other keys; each step's
    ``field_means`` in metrics.jsonl holds its mean)."""
    right = SCORERS[data_source](ground_truth, solution_str)
    return {"score": 1.0 if right else 0.0, "carry": bool((extra_info or {}).get("carry"))}


def build(config: dict) -> Graph:
    g = Graph("dataset_prompts")
    g.model("policy", source="builtin:policy")
    g.pool("rollout", workers=1)
    g.pool("trainer", workers=1)
    # the ground truth becomes the ``answer`` field; check_with: the task's exact rule gives
    # the run's task_accuracy (prompts of a task pivotflow does not know leave it null)
    prompts = g.source("prompts", path=config["data"], prompt_key="question",
                       answer_key="reward_model.ground_truth", check_with="arithmetic",
                       group_size=config["group_size"],
                       groups_per_step=config["groups_per_step"])
    rollout = g.generate("rollout", model="policy", pool="rollout", max_tokens=6)
    reward = g.map("reward", verl_reward(compute_score, extra=("carry",)),
                   writes=["reward", "carry"])
    advantage = g.group("advantage", grpo_advantage, writes=["advantage"])
    train = g.train("train", model="policy", pool="trainer", lr=config["lr"])
    g.chain(prompts, rollout, reward, advantage, train)
    return g


def write_table(path: Path, n: int = 512, seed: int = 1) -> Path:
    """``n`` distinct sums of the built-in task as a verl-style Parquet table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pivotflow.tasks.registry import get_task, make_dataset

    rows = [{"data_source": "arithmetic", "question": p.prompt, "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": p.answer},
             "extra_info": {"split": "train", "index": i,
                            "carry": (p.meta["a"] % 10 + p.meta["b"] % 10) >= 10}}
            for i, p in enumerate(make_dataset(get_task("arithmetic"), n, seed))]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def main() -> None:
    from pivotflow.run import run

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="dataset-"))
    out.mkdir(parents=True, exist_ok=True)
    data = write_table(out / "data.parquet")
    result = run(Path(__file__), steps=args.steps, out=out / "run",
                 sets=[f"graph.data={data}"])
    s = result.summary
    print(f"{s['steps']} steps on {data}: accuracy {s['task_accuracy_start']} -> "
          f"{s['task_accuracy_end']}; records in {result.out}")


if __name__ == "__main__":
    main()
