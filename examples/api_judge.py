"""The GenRM behind an OpenAI-compatible API: grpo_genrm's judge served outside the run.

prompts (the built-in sums) -> rollout -> genrm (the judge's API, awaited) -> GRPO -> train

    python examples/api_judge.py [--steps 60] [--out runs/api-judge]

starts ``examples/openai_server.py`` on the built-in judge (a process of its own, a free
loopback port) and trains against it. Against a judge you serve (vLLM, SGLang):

    vllm serve /path/to/judge --served-model-name judge --port 8000 &
    pivotflow run examples/api_judge.py --set graph.judge_url=http://127.0.0.1:8000/v1

The template and parser are ``graphs/grpo_genrm.py``'s, so the judge reads what a pool's
judge reads and answers greedily: the same verdicts for the same responses (tested). What
changes is where the judge runs: its requests are awaited on the controller's loop (up to
``graph.concurrency`` at once) while the run's own workers roll out and train.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from pivotflow.graph import Graph
from pivotflow.rl.api_judge import openai_judge
from pivotflow.rl.group_fns import grpo_advantage
from pivotflow.tasks.judge_format import judge_prompt, parse_verdict

DEFAULTS = {"group_size": 8, "groups_per_step": 8, "lr": 3e-5, "max_tokens": 6, "digits": 2,
            "judge_url": "http://127.0.0.1:8000/v1", "judge_model": "judge", "concurrency": 64,
            "deadline_s": 120.0}


def judge_template(prompt: str, response: str, **_: object) -> str:
    """What the GenRM reads: the question with the policy's answer, e.g. "47+38=84?"."""
    return judge_prompt(prompt, response)


def parse(verdict: str, **_: object) -> float | None:
    """The GenRM's text to a reward: "85:Yes" -> 1.0, "85:No" -> 0.0, anything else -> None."""
    return parse_verdict(verdict)


def build(config: dict) -> Graph:
    g = Graph("api_judge")
    g.model("policy", source="builtin:policy")
    g.pool("rollout", workers=1)
    g.pool("trainer", workers=1)
    prompts = g.source("prompts", task="arithmetic", digits=config["digits"],
                       group_size=config["group_size"],
                       groups_per_step=config["groups_per_step"])
    rollout = g.generate("rollout", model="policy", pool="rollout",
                         max_tokens=config["max_tokens"], temperature=1.0)
    genrm = g.map("genrm", openai_judge(config["judge_url"], config["judge_model"],
                                        judge_template, parse),
                  writes=["verdict", "reward", "judge_failed"],
                  concurrency=config["concurrency"], deadline_s=config["deadline_s"])
    advantage = g.group("advantage", grpo_advantage, writes=["advantage"])
    train = g.train("train", model="policy", pool="trainer", lr=config["lr"])
    g.chain(prompts, rollout, genrm, advantage, train)
    return g


def start_judge_server(folder: Path, name: str = "judge") -> tuple[subprocess.Popen[str], str]:
    """examples/openai_server.py on ``folder``, a process of its own; (process, base URL)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("openai_server.py")),
                             str(folder), "--port", str(port), "--name", name],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if not proc.stdout.readline():  # "serving ... at <url>": listening
        raise RuntimeError(f"examples/openai_server.py on {folder} exited ({proc.wait()})")
    return proc, f"http://127.0.0.1:{port}/v1"


def main() -> None:
    from pivotflow.run import run
    from pivotflow.tasks.cache import ensure_models

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="api-judge-")) / "run"
    _, judge_dir = ensure_models(seed=0)
    server, url = start_judge_server(judge_dir)
    try:
        result = run(Path(__file__), steps=args.steps, out=out,
                     sets=[f"graph.judge_url={url}"])
    finally:
        server.terminate()
        server.wait()
    s = result.summary
    print(f"{s['steps']} steps: accuracy {s['task_accuracy_start']} -> "
          f"{s['task_accuracy_end']}; records in {result.out}")


if __name__ == "__main__":
    main()
