"""Math RL scored against reference answers, as GSM8K, MATH and DAPO-Math runs are.

prompts (question, a worked answer ending in "#### N") -> rollout -> math_reward -> GRPO -> train

    python examples/math_rl.py [--steps 30] [--out runs/math]
    python examples/math_rl.py --check      # score MATH-style responses; no model, no run
    pivotflow run examples/math_rl.py --set graph.data=gsm8k.parquet \\
        --set graph.model=/models/Qwen2.5-Math-1.5B --set graph.style=auto \\
        [--set graph.eval_data=gsm8k_test.parquet --set eval_every=10 --set eval_samples=4]

The table is GSM8K's layout (``question``, and ``answer``: a worked solution whose last line is
``#### N``); ``math_reward`` takes the reference out of it (a MATH ``solution`` column's
``\\boxed{}`` works the same, and a bare answer column is taken whole). The built-in policy
answers a sum with its digits alone, so this graph reads the response's last number
(``graph.style=last_number``, verl's "flexible" GSM8K mode); a model prompted to reason and box
its answer is scored with ``graph.style=auto``: the last ``\\boxed{}``, else ``####``, else
``Answer:``. The reward writes ``correct`` too (``write_correct``), so the step records'
``task_accuracy`` (and an evaluation round's accuracy and pass@k) is its check; their
``logged_metrics`` hold ``math_correct``, ``math_no_answer``, ``math_algebra`` and
``math_timeout``.

``--check`` scores answers written the ways MATH's are (fractions, radicals, tuples, sets,
intervals, units, a rewritten polynomial) against references written otherwise, and a few near
misses, with the reward the graph uses.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from pivotflow.graph import Graph
from pivotflow.rl.group_fns import grpo_advantage
from pivotflow.rl.math_reward import math_reward

DEFAULTS = {"data": "data.jsonl", "eval_data": "", "model": "builtin:policy",
            "style": "last_number",
            "prompt_key": "question", "max_tokens": 6, "group_size": 8, "groups_per_step": 8,
            "lr": 1e-5, "checkers": 1}

# (a response, the reference answer, the reward it should get)
CHECKS = [
    ("So the probability is $\\boxed{\\dfrac{1}{2}}$.", "0.5", 1.0),
    ("Rationalizing, $\\boxed{\\frac{\\sqrt{2}}{2}}$", "\\frac{1}{\\sqrt{2}}", 1.0),
    ("The vertex is at $\\boxed{(2, -3)}$.", "(2,-3)", 1.0),
    ("The roots are $\\boxed{3, -1}$.", "-1, 3", 1.0),
    ("Hence $x \\in \\boxed{[0, \\frac{1}{2})}$.", "[0,0.5)", 1.0),
    ("It is $\\boxed{12\\text{ inches}}$ long.", "12", 1.0),
    ("Expanding: $\\boxed{x^2+2x+1}$", "(x+1)^2", 1.0),
    ("so $\\boxed{\\{1, 2\\}}$", "\\{2, 1\\}", 1.0),
    ("She pays 5 * 3 = 15 dollars.\n#### 15", "Each costs 5.\n5 * 3 = 15\n#### 15", 1.0),
    ("Answer: 90^\\circ", "90", 1.0),
    ("The answer is $\\boxed{0.333}$.", "\\frac{1}{3}", 0.0),
    ("The interval is $\\boxed{(0, \\frac{1}{2}]}$", "[0,0.5)", 0.0),
    ("The answer is 15.", "15", 0.0),  # states no answer: neither boxed, #### nor Answer:
]


def build(config: dict) -> Graph:
    g = Graph("math_rl")
    g.model("policy", source=config["model"])
    g.pool("rollout", workers=1)
    g.pool("trainer", workers=1)
    # (no check_with: the answer column is a worked solution, which a task's own exact rule
    # would not read; the reward writes `correct` instead, so task_accuracy is its check)
    # eval_data: held-out prompts for evaluation rounds (--set eval_every=N), scored by the
    # same reward: their accuracy and pass@k are its check (write_correct)
    prompts = g.source("prompts", path=config["data"], prompt_key=config["prompt_key"],
                       answer_key="answer", group_size=config["group_size"],
                       groups_per_step=config["groups_per_step"],
                       eval_path=config["eval_data"] or None)
    rollout = g.generate("rollout", model="policy", pool="rollout",
                         max_tokens=config["max_tokens"])
    # most answers are decided at once; those that need algebra wait for a checker process
    reward = g.map("reward", math_reward("answer", style=config["style"],
                                         workers=config["checkers"], write_correct=True),
                   writes=["reward", "correct"], concurrency=4 * config["checkers"])
    advantage = g.group("advantage", grpo_advantage, writes=["advantage"])
    train = g.train("train", model="policy", pool="trainer", lr=config["lr"])
    g.chain(prompts, rollout, reward, advantage, train)
    return g


def write_table(path: Path, n: int = 512, seed: int = 1) -> Path:
    """``n`` sums of the built-in task in GSM8K's layout, as JSON lines."""
    from pivotflow.tasks.registry import get_task, make_dataset

    with path.open("w") as f:
        for p in make_dataset(get_task("arithmetic"), n, seed):
            worked = f"{p.meta['a']} {p.meta['op']} {p.meta['b']} = {p.answer}\n#### {p.answer}"
            f.write(json.dumps({"question": p.prompt, "answer": worked}) + "\n")
    return path


def check() -> list[float]:
    """``CHECKS``' responses scored as the graph scores (``style="auto"``)."""
    reward = math_reward("answer")

    async def scores() -> list[float]:
        return [await reward(completion=response, answer=reference)
                for response, reference, _ in CHECKS]

    return asyncio.run(scores())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--check", action="store_true",
                    help="score MATH-style responses against their references and stop")
    args = ap.parse_args()
    if args.check:
        got = check()
        print(json.dumps({"rewards": got, "expected": [want for *_, want in CHECKS]}))
        sys.exit(0 if got == [want for *_, want in CHECKS] else 1)
    from pivotflow.run import run

    out = args.out or Path(tempfile.mkdtemp(prefix="math-rl-"))
    out.mkdir(parents=True, exist_ok=True)
    data = write_table(out / "data.jsonl")
    result = run(Path(__file__), steps=args.steps, out=out / "run",
                 sets=[f"graph.data={data}"])
    s = result.summary
    print(f"{s['steps']} steps on {data}: accuracy {s['task_accuracy_start']} -> "
          f"{s['task_accuracy_end']}; records in {result.out}")


if __name__ == "__main__":
    main()
