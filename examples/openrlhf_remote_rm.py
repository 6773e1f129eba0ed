"""OpenRLHF's remote reward: the run asks a reward server over HTTP, as ``--remote_rm_url``.

prompts (the built-in sums) -> rollout -> reward (the server, awaited) -> GRPO -> train

    python examples/openrlhf_remote_rm.py [--steps 60] [--latency-ms 0] [--out runs/orm]

starts ``examples/reward_server.py`` on a free loopback port and runs against it. With a
server of your own (``openrlhf.cli.serve_rm``, or any that speaks the protocol):

    python examples/reward_server.py --port 5000 &
    pivotflow run examples/openrlhf_remote_rm.py \\
        --set graph.reward_url=http://127.0.0.1:5000/get_reward

The reward stage sends each response as OpenRLHF sends it: ``query`` the prompt as the
policy's chat template rendered it followed by the response, special tokens kept
(``sequence_text``), ``prompts`` the rendered prompt (``prompt_text``), ``labels`` the
prompt file's ``answer``. The call is awaited on the controller's loop, up to
``graph.concurrency`` at once, so rollouts and training go on while the server works; the
server's ``extra_logs`` land in metrics.jsonl's ``logged_metrics``. A ``reward_func.py`` file
(OpenRLHF's other ``--remote_rm_url``) works the same way: ``--set
graph.reward_url=path/to/reward_func.py``.

``--set graph.call=inline`` makes the same request from a plain function instead, which holds
the controller's loop for each one (what a reward function written without ``async def`` does),
and ``graph.call=local`` computes the server's rule in the controller, with no server:
``bench/remote_reward.py`` runs the three side by side.
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
from pathlib import Path
from typing import Any

from pivotflow.graph import Graph
from pivotflow.rl.group_fns import grpo_advantage
from pivotflow.rl.openrlhf_reward import openrlhf_reward

DEFAULTS = {"group_size": 8, "groups_per_step": 8, "lr": 1e-5,
            "reward_url": "http://127.0.0.1:5000/get_reward", "concurrency": 64,
            "deadline_s": 120.0, "call": "await"}
CALLS = ("await", "inline", "local")


def build(config: dict) -> Graph:
    g = Graph("openrlhf_remote_rm")
    g.model("policy", source="builtin:policy")
    g.pool("rollout", workers=1)
    g.pool("trainer", workers=1)
    prompts = g.source("prompts", task="arithmetic", group_size=config["group_size"],
                       groups_per_step=config["groups_per_step"])
    rollout = g.generate("rollout", model="policy", pool="rollout", max_tokens=6)
    reward = g.map("reward", reward_fn(config), writes=["reward"],
                   concurrency=config["concurrency"], deadline_s=config["deadline_s"])
    advantage = g.group("advantage", grpo_advantage, writes=["advantage"])
    train = g.train("train", model="policy", pool="trainer", lr=config["lr"])
    g.chain(prompts, rollout, reward, advantage, train)
    return g


def reward_fn(config: dict) -> Any:
    """The reward stage's function, as ``graph.call`` asks (see the module's docstring)."""
    call, url = config["call"], config["reward_url"]
    if call == "await":
        return openrlhf_reward(url)
    if call == "local":
        rule = reward_server().reward
        return lambda prompt_text, sequence_text, answer, **_: rule(sequence_text, prompt_text,
                                                                    answer)[0]
    if call != "inline":
        raise ValueError(f"graph.call={call!r}: one of {', '.join(CALLS)}")
    import httpx

    client = httpx.Client(timeout=config["deadline_s"])

    def inline(prompt_text: str, sequence_text: str, answer: str, **_: Any) -> float:
        got = client.post(url, json={"query": [sequence_text], "prompts": [prompt_text],
                                     "labels": [answer]})
        got.raise_for_status()
        return float(got.json()["rewards"][0])

    return inline


def reward_server() -> Any:
    """examples/reward_server.py, loaded from beside this file."""
    spec = importlib.util.spec_from_file_location(
        "reward_server", Path(__file__).with_name("reward_server.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    from pivotflow.metrics import read_metrics
    from pivotflow.run import run

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="openrlhf-rm-")) / "run"
    server = reward_server().serve_in_thread(latency_s=args.latency_ms / 1000)
    try:
        result = run(Path(__file__), steps=args.steps, out=out,
                     sets=[f"graph.reward_url={server.url()}"])
    finally:
        server.shutdown()
    s = result.summary
    logged = read_metrics(result.out / "metrics.jsonl")[-1].get("logged_metrics")
    print(f"{s['steps']} steps: accuracy {s['task_accuracy_start']} -> "
          f"{s['task_accuracy_end']}; {server.requests} requests, at most "
          f"{server.most_at_once} at once; the last step's extra_logs {logged}; records in "
          f"{result.out}")


if __name__ == "__main__":
    main()
