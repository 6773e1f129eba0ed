"""Code RL: the policy writes Python (or C++), and each program runs against its task's tests in a
sandbox.

    python examples/code_rl.py --check        # the tasks' reference solutions, scored: all 1.0
    python examples/code_rl.py [--steps 3]    # a tiny random model: read it for the wiring
    pivotflow run examples/code_rl.py --set graph.model=/path/to/Qwen2.5-Coder-1.5B-Instruct \\
        --set graph.prompts=my_code_tasks.jsonl --set device=cuda

A task is a row of a JSONL (or Parquet) prompt file: ``prompt``, the chat messages the policy's
chat template renders, and ``tests``, in any of the formats ``pivotflow.rl.code_reward`` reads:
stdin/stdout cases (``{"inputs": [...], "outputs": [...]}``, APPS, TACO, CodeContests,
DeepCoder), a function's calls (``{"fn_name": ..., "inputs": [[args]...], "outputs": [...]}``,
LeetCode), or assert sources (``["assert f(1) == 2", ...]``, MBPP). Other columns ride along
as fields (``reference`` here: a solution, which ``--check`` scores, and ``language``, its
fence's). With ``--set graph.language=auto`` a program in a ```cpp block is compiled with g++ and
run on its stdin/stdout cases (one task here is C++'s); "python" (the default) runs every
program as Python; ``--set graph.sandbox_url=http://HOST:8080`` runs them on sandbox servers
(``python -m pivotflow.rl.sandbox_server`` on other hosts) instead of this one. The reward is
the share
of a task's cases its program passes (``--set graph.mode=all``: 1.0 only if all pass), each
program in a bubblewrap sandbox of its own (``apt-get install bubblewrap``); GRPO's advantage
and a plain policy-gradient step do the rest. Each step's ``logged_metrics`` say how the
programs failed (``code_wrong``, ``code_error``, ``code_timeout``, ``code_other``).

``main`` builds the byo_model example's tiny random model (a Qwen2 with a byte-level BPE) so the
file runs anywhere; its programs are random text, so its rewards are 0 and ``code_error`` 1:
the numbers to read are that every step ran and every program was judged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from pivotflow.graph import Graph
from pivotflow.rl.code_reward import code_reward
from pivotflow.rl.group_fns import grpo_advantage

DEFAULTS = {"model": "", "prompts": "code_tasks.jsonl", "max_tokens": 64, "group_size": 4,
            "groups_per_step": 2, "lr": 1e-6, "temperature": 1.0,
            # the reward (rl/code_reward.py): "fraction" of the cases passed, or "all" (1.0
            # only if every case passes, DeepCoder's); programs scored at once, and each
            # case's wall time
            "mode": "fraction", "sandboxes": 2, "case_timeout_s": 5.0,
            # "python", "cpp" or "auto" (C++ where the answer's last fence is ```cpp)
            "language": "python",
            # sandbox servers (python -m pivotflow.rl.sandbox_server, or SandboxFusion),
            # comma-separated, that run the programs instead of this host; and their token
            "sandbox_url": "", "sandbox_token": ""}

SYSTEM = {"python": "Write a Python program in a ```python block.",
          "cpp": "Write a C++17 program in a ```cpp block."}
TASKS = [  # (the statement, the tests, a reference solution; a C++ one says so last)
    ("Read two integers on one line and print their sum.",
     {"inputs": ["1 2\n", "-5 5\n", "100 23\n"], "outputs": ["3\n", "0\n", "123\n"]},
     "a, b = map(int, input().split())\nprint(a + b)\n"),
    ("Read a line and print it reversed.",
     {"inputs": ["abc\n", "racecar\n", "ab cd\n"], "outputs": ["cba\n", "racecar\n", "dc ba\n"]},
     "print(input()[::-1])\n"),
    ("Read n, then n integers on the next line; print the largest.",
     {"inputs": ["3\n1 9 4\n", "1\n-7\n"], "outputs": ["9\n", "-7\n"]},
     "input()\nprint(max(map(int, input().split())))\n"),
    ("Write is_prime(n): True when n is a prime number.",
     ["assert is_prime(2)", "assert not is_prime(1)", "assert is_prime(97)",
      "assert not is_prime(91)"],
     "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n**0.5) + 1))\n"),
    ("Write fizz(n): 'Fizz' for multiples of 3, 'Buzz' of 5, 'FizzBuzz' of both, else str(n).",
     ["assert fizz(3) == 'Fizz'", "assert fizz(10) == 'Buzz'", "assert fizz(30) == 'FizzBuzz'",
      "assert fizz(7) == '7'"],
     "def fizz(n):\n    return 'Fizz' * (n % 3 == 0) + 'Buzz' * (n % 5 == 0) or str(n)\n"),
    ("class Solution: twoSum(nums, target) returns the indices of the two numbers that sum to "
     "target.",
     {"fn_name": "twoSum", "inputs": [[[2, 7, 11, 15], 9], [[3, 2, 4], 6]],
      "outputs": [[0, 1], [1, 2]]},
     "class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
     "        for i, n in enumerate(nums):\n            if target - n in seen:\n"
     "                return [seen[target - n], i]\n            seen[n] = i\n"),
    ("Read n, then n integers; print how many of them are even.",
     {"inputs": ["4\n1 2 3 4\n", "3\n7 9 11\n"], "outputs": ["2\n", "0\n"]},
     "#include <bits/stdc++.h>\nint main() { int n, x, even = 0; std::cin >> n;\n"
     "  while (n-- && std::cin >> x) even += x % 2 == 0;\n  std::cout << even << '\\n'; }\n",
     "cpp"),
]


def build(config: dict) -> Graph:
    if not config["model"]:
        raise ValueError("set graph.model=/path/to/model/folder (or run this file with python)")
    g = Graph("code_rl")
    g.model("policy", source=config["model"])
    g.pool("rollout", workers=1)
    g.pool("trainer", workers=1)
    prompts = g.source("prompts", path=config["prompts"], answer_key=None,
                       group_size=config["group_size"],
                       groups_per_step=config["groups_per_step"])
    rollout = g.generate("rollout", model="policy", pool="rollout",
                         max_tokens=config["max_tokens"], temperature=config["temperature"])
    reward = g.map("reward", code_reward("tests", mode=config["mode"],
                                         workers=config["sandboxes"],
                                         timeout_s=config["case_timeout_s"],
                                         language=config["language"],
                                         sandbox_url=config["sandbox_url"].split(",")
                                         if config["sandbox_url"] else None,
                                         sandbox_token=config["sandbox_token"]),
                   # as many calls out as sandboxes: a call waiting for one would spend its
                   # deadline waiting (the stage's turn queue does not)
                   writes=["reward"], concurrency=config["sandboxes"], deadline_s=120)
    advantage = g.group("advantage", grpo_advantage, writes=["advantage"])
    train = g.train("train", model="policy", pool="trainer", lr=config["lr"])
    g.chain(prompts, rollout, reward, advantage, train)
    return g


def write_tasks(path: Path) -> Path:
    """The tasks as prompt-file rows: chat messages, their tests, a reference solution and
    its language."""
    with path.open("w") as f:
        for statement, tests, reference, *language in TASKS:
            lang = language[0] if language else "python"
            f.write(json.dumps({"prompt": [{"role": "system", "content": SYSTEM[lang]},
                                           {"role": "user", "content": statement}],
                                "tests": tests, "reference": reference,
                                "language": lang}) + "\n")
    return path


def check(path: Path) -> list[float]:
    """Each task's reference solution, as a policy would answer it (in its language's fence),
    scored by the reward (``language="auto"``: C++ needs g++)."""
    reward = code_reward("tests", language="auto")
    rows = [json.loads(line) for line in path.read_text().splitlines()]

    async def scores() -> list[float]:
        return list(await asyncio.gather(*(
            reward(f"```{r['language']}\n{r['reference']}```", tests=r["tests"])
            for r in rows)))

    return asyncio.run(scores())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--check", action="store_true",
                    help="score the tasks' reference solutions and stop")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="code-rl-"))
    out.mkdir(parents=True, exist_ok=True)
    tasks = write_tasks(out / "code_tasks.jsonl")
    if args.check:
        got = check(tasks)
        print(json.dumps({"reference_rewards": got}))
        sys.exit(0 if all(r == 1.0 for r in got) else 1)
    sys.path.insert(0, str(Path(__file__).parent))
    from byo_model import run_on_tiny_model  # (the byo example's tiny model)

    run_on_tiny_model(Path(__file__), out, args.steps, [f"graph.prompts={tasks}"])


if __name__ == "__main__":
    main()
