"""Tool-integrated reasoning: the policy may run Python while it solves a math problem, and is
rewarded for its final answer (ToRL, SimpleTIR, verl's ReTool recipe).

prompts -> rollout (multi-turn: reason, call code_interpreter, read what the program printed,
go on, answer in \\boxed{}) -> math_reward -> GRPO -> train (the loss skips the tool's output)

    python examples/tool_integrated_math.py --check   # each task's reference program, run in
                                                      # the sandbox, its output scored: all 1.0
    python examples/tool_integrated_math.py [--steps 3]  # a tiny random model: the wiring
    pivotflow run examples/tool_integrated_math.py --set graph.model=/models/Qwen2.5-7B-Instruct \\
        --set graph.prompts=my_math.jsonl --set device=cuda

A task is a row of a JSONL (or Parquet) prompt file: ``prompt`` (chat messages) and ``answer``
(the reference; a worked solution's ``\\boxed{}`` or ``####`` is taken out of it). The
policy's chat template renders the prompt with the tool's schema (Qwen2.5's lists it in the
system message; ``Graph.generate``'s ``tools_in_prompt``). Calls are Hermes/Qwen
``<tool_call>`` JSON, ``{"name": "code_interpreter", "arguments": {"code": "..."}}``; each
program runs in a bubblewrap sandbox of its own here (``pivotflow/tools/code_interpreter.py``),
or with ``--set graph.sandbox_url=http://HOST:8080`` on sandbox servers (``python -m
pivotflow.rl.sandbox_server``, a SandboxFusion deployment, or ``ray``). With ``--set
graph.tool_parser=python_block`` the calls are Qwen2.5-Math's (and ToRL's) instead: a
```` ```python ```` block, then ```` ```output ````, where the turn stops and the program's output
follows, the fence closed after it (write the tasks with ``write_tasks(path,
"python_block")`` for that format's instruction). The step records hold the tool
figures (``tool_calls_per_sample``, ``tool_use_rate``, ``tool_errors``) beside the math
reward's (``math_correct``, ...).
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

DEFAULTS = {"model": "", "prompts": "math_tasks.jsonl", "group_size": 4, "groups_per_step": 2,
            "lr": 1e-6, "temperature": 1.0,
            # each turn's tokens, the turns, and the whole trajectory's (tool output included)
            "max_tokens": 48, "max_turns": 3, "max_total_tokens": 160,
            # programs run at once, each one's wall time and address space
            "sandboxes": 2, "program_timeout_s": 5.0, "program_memory_mb": 512,
            # sandbox servers (comma-separated) that run the programs instead of this host
            "sandbox_url": "", "sandbox_token": "",
            # "hermes": <tool_call> JSON (the tool's schema in the chat template's prompt);
            # "python_block": Qwen2.5-Math's ```python ... ``` ```output format (ToRL's)
            "tool_parser": "hermes"}

SYSTEM = {"hermes": "Solve the problem. You may run Python by calling the code_interpreter "
                    "tool; it returns what your program prints. Give the final answer in "
                    "\\boxed{}.",
          # (Qwen2.5-Math's own tool-integrated instruction)
          "python_block": "Please integrate natural language reasoning with programs to solve "
                          "the problem above, and put your final answer within \\boxed{}."}
TASKS = [  # (the question, the reference answer, a program that prints it)
    ("What is the sum of the first 100 positive integers?", "5050",
     "print(sum(range(1, 101)))"),
    ("How many primes are less than 100?", "25",
     "print(sum(all(n % d for d in range(2, n)) for n in range(2, 100)))"),
    ("What is the remainder when 2^100 is divided by 7?", "2", "print(pow(2, 100, 7))"),
    ("What is the sum of the digits of 30!?", "117",
     "import math\nprint(sum(map(int, str(math.factorial(30)))))"),
    ("Write 0.375 as a fraction in lowest terms.", "\\frac{3}{8}",
     "from fractions import Fraction\nf = Fraction('0.375')\n"
     "print(f'\\\\frac{{{f.numerator}}}{{{f.denominator}}}')"),
    ("Find the positive solution of x^2 - 5x - 14 = 0.", "7",
     "import math\nprint(int((5 + math.sqrt(25 + 56)) / 2))"),
]
TOOL = "pivotflow.tools.code_interpreter:code_interpreter"


def build(config: dict) -> Graph:
    if not config["model"]:
        raise ValueError("set graph.model=/path/to/model/folder (or run this file with python)")
    g = Graph("tool_integrated_math")
    g.model("policy", source=config["model"])
    g.pool("rollout", workers=1)
    g.pool("trainer", workers=1)
    prompts = g.source("prompts", path=config["prompts"], group_size=config["group_size"],
                       groups_per_step=config["groups_per_step"])
    servers = {"sandbox_url": config["sandbox_url"], "sandbox_token": config["sandbox_token"]} \
        if config["sandbox_url"] else {}
    rollout = g.generate("rollout", model="policy", pool="rollout",
                         max_tokens=config["max_tokens"], temperature=config["temperature"],
                         tools=TOOL, max_turns=config["max_turns"],
                         max_total_tokens=config["max_total_tokens"],
                         tool_parser=config["tool_parser"],
                         # (the python block format's prompt lists no tools)
                         tools_in_prompt=config["tool_parser"] == "hermes",
                         tool_pool={"workers": config["sandboxes"],
                                    "timeout_s": config["program_timeout_s"],
                                    "memory_mb": config["program_memory_mb"], **servers})
    reward = g.map("reward", math_reward("answer"), writes=["reward"], concurrency=4)
    advantage = g.group("advantage", grpo_advantage, writes=["advantage"])
    train = g.train("train", model="policy", pool="trainer", lr=config["lr"])
    g.chain(prompts, rollout, reward, advantage, train)
    return g


def write_tasks(path: Path, tool_parser: str = "hermes") -> Path:
    """The tasks as prompt-file rows: chat messages (the instruction of the call format),
    the answer, a reference program."""
    with path.open("w") as f:
        for question, answer, program in TASKS:
            f.write(json.dumps({"prompt": [{"role": "system", "content": SYSTEM[tool_parser]},
                                           {"role": "user", "content": question}],
                                "answer": answer, "reference": program}) + "\n")
    return path


def check(path: Path) -> list[float]:
    """Each task as a policy that uses the tool would do it: its reference program through the
    code interpreter (in the sandbox, as a run calls it), then what it printed as the boxed
    answer, scored by the graph's reward."""
    from pivotflow.tools import ToolCall, ToolPool, ToolRegistry

    rows = [json.loads(line) for line in path.read_text().splitlines()]
    reward = math_reward("answer")
    registry = ToolRegistry()
    registry.load(TOOL)

    async def scores() -> list[float]:
        with ToolPool(registry, workers=2, timeout_s=10.0) as pool:
            printed = await pool.acall_all([ToolCall("code_interpreter",
                                                     {"code": r["reference"]}) for r in rows])
        return [await reward(completion=f"So the answer is $\\boxed{{{out.content.strip()}}}$.",
                             answer=r["answer"]) for r, out in zip(rows, printed, strict=True)]

    return asyncio.run(scores())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--check", action="store_true",
                    help="run the tasks' reference programs, score their outputs and stop")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="tir-"))
    out.mkdir(parents=True, exist_ok=True)
    tasks = write_tasks(out / "math_tasks.jsonl")
    if args.check:
        got = check(tasks)
        print(json.dumps({"reference_rewards": got}))
        sys.exit(0 if all(r == 1.0 for r in got) else 1)
    sys.path.insert(0, str(Path(__file__).parent))
    from byo_model import run_on_tiny_model  # (the byo example's tiny model)

    run_on_tiny_model(Path(__file__), out, args.steps, [f"graph.prompts={tasks}"])


if __name__ == "__main__":
    main()
