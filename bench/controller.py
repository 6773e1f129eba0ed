"""Controller overhead: a 5-stage graph whose generate workers do no model work (EchoEngine).

prompts -> rollout (echo) -> judge (echo) -> reward (map) -> advantage (group) -> train (a
1-layer model, so the optimizer step is cheap). Reports end-to-end samples/s and the controller's
CPU time per sample per hop (a hop = one dispatch + one result on a model stage; two per sample),
one job per frame and up to 32 per frame, plus the unloaded job round trip seen by the
controller and how much of it the worker held the job, beside the bare transport's round trip
to an echo process measured in the same run (``bench/transport.py``'s (c): the floor the
machine sets now, so the two compare as a ratio), back to back and after idling as long as the
unloaded run's step (the judge worker waits that long for each job, and on a VM a halted vCPU's
wake-up grows with the idle time: 25 us back to back, 134 us after 5 ms, measured 2026-12-01). Each figure is the median of
``--repeat`` runs (alternated, so drift on a shared machine hits every configuration alike);
``runs`` lists the headline figures of every run. Prints one JSON object on its last line.

    python bench/controller.py [--steps 20] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.engines.torch.weights import save_checkpoint
from pivotflow.metrics import read_metrics
from pivotflow.run import run
from pivotflow.tokenizer import default_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from echo_graph import write_echo_graph  # noqa: E402 - a sibling file, not a package
from transport import bench_router  # noqa: E402

HOPS = 2  # rollout and judge


def measure(graph: Path, out: Path, steps: int, sets: list[str]) -> dict[str, float]:
    # static: the control plane alone (a planner would move these model-free workers around)
    result = run(graph, sets=["engine=echo", "live=false", "planner=static",
                              "checkpoint_every=0", *sets], out=out, steps=steps, console=False)
    recs = read_metrics(out / "metrics.jsonl")
    first, last = recs[1], recs[-1]  # skip step 1: it includes worker start-up
    samples = sum(r["samples"] for r in recs[2:])
    wall = last["time_s"] - first["time_s"]
    cpu = last["controller_cpu_s"] - first["controller_cpu_s"]
    loop_cpu = last["controller_loop_cpu_s"] - first["controller_loop_cpu_s"]
    return {
        "samples_per_s": samples / wall,
        "controller_cpu_us_per_sample_per_hop": cpu / samples / HOPS * 1e6,
        # the event loop's thread alone; the rest is zmq's I/O thread (and any other thread)
        "loop_thread_cpu_us_per_sample_per_hop": loop_cpu / samples / HOPS * 1e6,
        "job_rtt_us_p50": result.summary.get("job_rtt_us_p50"),
        "job_worker_us_p50": result.summary.get("job_worker_us_p50"),
        "samples": samples,
        "step_s": wall / (len(recs) - 2),
    }


def median_of(runs: list[dict]) -> dict:
    """Field by field median of equally shaped measurements (nested per-stage dicts too)."""
    out: dict = {}
    for key, first in runs[0].items():
        values = [r[key] for r in runs]
        if isinstance(first, dict):
            out[key] = median_of(values)
        elif any(v is None for v in values):
            out[key] = None
        else:
            out[key] = statistics.median(values)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="pf-bench-") as tmp:
        root = Path(tmp)
        cfg = ModelConfig(vocab_size=99, hidden_size=16, intermediate_size=32,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
        for name in ("policy", "judge"):
            save_checkpoint(root / name, cfg, Decoder(cfg).state_dict())
            default_tokenizer().save(root / name)  # a model folder carries its tokenizer
        graph = write_echo_graph(root / "graph.py", name="controller_bench",
                                 policy=root / "policy", judge=root / "judge", group_size=8,
                                 groups_per_step=32)
        ones, batched_runs, unloaded_runs, floors, idle_floors = [], [], [], [], []
        async_runs = []
        for i in range(args.repeat):
            ones.append(measure(graph, root / f"one{i}", args.steps,
                                ["max_jobs_per_frame=1", "results_per_frame=1"]))
            batched_runs.append(measure(graph, root / f"batched{i}", args.steps,
                                        ["max_jobs_per_frame=32"]))
            async_runs.append(measure(graph, root / f"async{i}", args.steps,
                                      ["max_jobs_per_frame=32", "graph.async_reward=true"]))
            unloaded_runs.append(measure(graph, root / f"unloaded{i}", max(20, args.steps),
                                         ["graph.group_size=2", "graph.groups_per_step=1"]))
            idle = round(unloaded_runs[-1]["step_s"], 4)
            bare = asyncio.run(bench_router(0, rtt_n=500, idle_s=(idle,)))
            floors.append(bare["rtt_us"]["p50"])
            idle_floors.append(bare["rtt_idle_us"][str(idle)]["p50"])
        one, batched, unloaded = median_of(ones), median_of(batched_runs), median_of(unloaded_runs)
        awaited = median_of(async_runs)
    print(json.dumps({
        "bench": "controller",
        "one_per_frame": one,
        "batched_32": batched,
        # per stage; the rollout's includes the weight refresh each new policy version needs
        "unloaded_job_rtt_us_p50": unloaded["job_rtt_us_p50"],
        # of which the worker held the job (arrival to its result's send); the rest is the
        # wire both ways and the controller's own time
        "unloaded_job_worker_us_p50": unloaded["job_worker_us_p50"],
        # the bare transport's round trip to an echo process now (one job a frame, back to
        # back); the judge's over it is what the controller and worker add
        "transport_rtt_us_p50": statistics.median(floors),
        "unloaded_judge_rtt_over_transport": (unloaded["job_rtt_us_p50"]["judge"]
                                              / statistics.median(floors)),
        # the same round trip after idling one unloaded step (``unloaded_step_s``): the floor
        # the judge's job actually meets; the judge's minus it is the two processes' Python
        "unloaded_step_s": unloaded["step_s"],
        "transport_rtt_after_step_idle_us_p50": statistics.median(idle_floors),
        "unloaded_judge_rtt_over_idle_transport": (unloaded["job_rtt_us_p50"]["judge"]
                                                   / statistics.median(idle_floors)),
        "batched_speedup": batched["samples_per_s"] / one["samples_per_s"],
        # batched_32 with the reward map an async def: its calls tasks of the loop (added
        # 12-06; the extra CPU per sample is what awaiting a stage costs the controller)
        "batched_32_async_reward": awaited,
        "async_reward_cpu_over_sync": (awaited["controller_cpu_us_per_sample_per_hop"]
                                       / batched["controller_cpu_us_per_sample_per_hop"]),
        "repeat": args.repeat,
        "runs": {
            "one_per_frame_cpu_us": [r["controller_cpu_us_per_sample_per_hop"] for r in ones],
            "batched_32_cpu_us": [r["controller_cpu_us_per_sample_per_hop"]
                                  for r in batched_runs],
            "batched_32_async_reward_cpu_us": [r["controller_cpu_us_per_sample_per_hop"]
                                               for r in async_runs],
            "unloaded_judge_rtt_us": [r["job_rtt_us_p50"]["judge"] for r in unloaded_runs],
            "transport_rtt_us": floors,
            "transport_rtt_after_step_idle_us": idle_floors,
        },
        "python": sys.version.split()[0],
    }))


if __name__ == "__main__":
    main()
