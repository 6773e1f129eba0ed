"""A remote reward server awaited beside the run against the same call made inline, on the
main job's shape (``examples/openrlhf_remote_rm.py``: the built-in sums, 8 prompts x 8
samples a step, one rollout and one trainer worker, real processes).

For each server latency (``--latencies-ms``: how long the server holds each request, as a
reward model's forward pass would), ``examples/reward_server.py`` runs as a process of its own
and three runs of ``--steps`` steps alternate (``--repeats`` times, the order reversed each
time, so a machine that slows down mid-sitting weighs on each alike):

* ``await``: ``openrlhf_reward(url)``, an async stage awaited on the controller's loop, up to
  64 requests at once (``graph.call=await``);
* ``inline``: the same request from a plain function, holding the loop for each
  (``graph.call=inline``: what a reward function written without ``async def`` does);
* ``local``: the server's rule computed in the controller, no server (``graph.call=local``):
  the ceiling, what the run does when the reward costs nothing.

The bound beside them: with the server's latency L and one request a sample, inline pays at
least 64 L a step on the controller's path, so its samples/s is at most 64 / (64 L + t_local),
t_local the local run's seconds a step. The last line printed is one JSON object with each
variant's samples/s and the ratios; each run's line goes to ``--out``.

    python bench/remote_reward.py [--steps 20] [--latencies-ms 0,20] [--repeats 2] \
        [--variants await,inline,local] [--out bench/results/remote_reward.jsonl]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from graph_runs import command, run_graph  # noqa: E402 - a sibling file, not a package

GRAPH = "examples/openrlhf_remote_rm.py"
VARIANTS = ("await", "inline", "local")
SAMPLES_PER_STEP = 64  # the example's 8 x 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(latency_ms: float) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "examples/reward_server.py", "--port", str(port),
                             "--latency-ms", str(latency_ms)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()  # "serving ... at <url>": listening
    return proc, f"http://127.0.0.1:{port}/get_reward"


def one_run(variant: str, url: str, steps: int, latency_ms: float) -> dict[str, Any]:
    sets = ["live=false", "seed=0", "models_seed=0", f"graph.call={variant}",
            f"graph.reward_url={url}"]
    summary, _ = run_graph(GRAPH, steps, sets)
    return {"bench": "remote_reward", "date": datetime.date.today().isoformat(),
            "variant": variant, "latency_ms": latency_ms, "steps": steps,
            "command": command(GRAPH, steps, [s for s in sets if "reward_url" not in s]),
            "samples_per_s": summary["samples_per_s"], "wall_s": summary["wall_s"],
            "task_accuracy_end": summary["task_accuracy_end"]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--latencies-ms", default="0,20")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="of await,inline,local")
    ap.add_argument("--out", type=Path, default=None, help="append each run's line here")
    args = ap.parse_args(argv)
    variants = tuple(v for v in VARIANTS if v in args.variants.split(","))
    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    for latency in (float(x) for x in args.latencies_ms.split(",")):
        server, url = start_server(latency)
        try:
            for i in range(args.repeats):
                for v in variants if i % 2 == 0 else variants[::-1]:
                    line = one_run(v, url, args.steps, latency)
                    print(json.dumps(line), file=sys.stderr, flush=True)
                    runs.append(line)
                    if args.out is not None:
                        with args.out.open("a") as f:
                            f.write(json.dumps(line) + "\n")
        finally:
            server.terminate()
            server.wait()
    out: dict[str, Any] = {"bench": "remote_reward", "steps": args.steps,
                           "repeats": args.repeats, "cpus": os.cpu_count(),
                           "bench_wall_s": round(time.monotonic() - started, 1)}
    for latency in sorted({r["latency_ms"] for r in runs}):
        tag = f"{latency:g}ms"
        rate = {v: statistics.mean(r["samples_per_s"] for r in runs
                                   if r["variant"] == v and r["latency_ms"] == latency)
                for v in variants}
        for v in variants:
            out[f"{v}_samples_per_s_{tag}"] = round(rate[v], 1)
        for a, b in (("await", "inline"), ("await", "local")):
            if a in rate and b in rate:
                out[f"{a}_over_{b}_{tag}"] = round(rate[a] / rate[b], 3)
        if "local" in rate:
            step_local = SAMPLES_PER_STEP / rate["local"]
            bound = SAMPLES_PER_STEP / (SAMPLES_PER_STEP * latency / 1000 + step_local)
            out[f"inline_bound_samples_per_s_{tag}"] = round(bound, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
