"""Global Parameter Storage in shared memory: publish and load a 100M-parameter set vs memcpy.

Run: python bench/params.py [--reps 5] [--threads 1] [--cold 3]

The set is a Qwen2-shaped decoder (16 layers, hidden 640, vocab 16000, untied head): 195 float32
tensors, 99.8M parameters, 399 MB. Per repetition, interleaved so a busy host skews all alike:
  memcpy     torch copy_ of one contiguous 399 MB buffer into another preallocated one;
  publish    ShmParamStore.publish of the 195 tensors, then gc(keep=1) (steady state: the
             buffer gc frees is reused by the next publish; the first, cold publish is reported
             on its own);
  load       what a worker does: load() (zero-copy map) + copy_ into preallocated destination
             tensors, views dropped (unmapped) inside the timing;
  load_into  ShmParamStore.load_into: pread straight into the same destination tensors.
cold_load_s is load + copy in a fresh process (destination freshly allocated, untouched), its
interpreter and torch import not counted (cold_import_s); the median of ``--cold`` processes run
right after the first publish, as a worker that joins does. (Run after heavy memory churn, the
first one can take seconds longer on a VM whose freed guest pages the host takes back.)
Copies run on one torch thread by default, as a worker's loader does: on a small shared host a
second OpenMP thread that gets descheduled stalls every copy at its barrier. Medians throughout.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from pivotflow.engines.torch.model import ModelConfig
from pivotflow.engines.torch.weights import config_to_hf, expected_shapes
from pivotflow.params.shm_store import ShmParamStore, default_root

CFG = ModelConfig(
    vocab_size=16000,
    hidden_size=640,
    intermediate_size=1728,
    num_hidden_layers=16,
    num_attention_heads=10,
    num_key_value_heads=10,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)
HF_CFG = config_to_hf(CFG, torch.float32)  # the store holds the model's HF config as data

COLD = """
import json, sys, time
t0 = time.perf_counter()
import torch
from pivotflow.params.shm_store import ShmParamStore
store = ShmParamStore(sys.argv[1])
torch.set_num_threads(int(sys.argv[2]))
t1 = time.perf_counter()
shapes = json.loads(sys.argv[3])
dest = {k: torch.empty(s) for k, s in shapes.items()}  # a worker's fresh parameters
t2 = time.perf_counter()
_, _, views = store.load("policy")
for k, d in dest.items():
    d.copy_(views[k])
del views
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t3 - t2}))
"""


def flat_views(flat: torch.Tensor, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """Tensors of ``shapes`` laid end to end in ``flat`` (so memcpy moves the same bytes)."""
    out, at = {}, 0
    for name, shape in shapes.items():
        n = math.prod(shape)
        out[name] = flat[at : at + n].view(shape)
        at += n
    return out


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads; 0 = torch's default")
    ap.add_argument("--cold", type=int, default=3, help="fresh processes for the cold load")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = expected_shapes(CFG)
    numel = sum(math.prod(s) for s in shapes.values())
    nbytes = numel * 4
    src_flat = torch.randn(numel, generator=torch.Generator().manual_seed(0))
    dst_flat = torch.zeros(numel)  # touched: a worker's parameters already exist
    src, dst = flat_views(src_flat, shapes), flat_views(dst_flat, shapes)
    store = ShmParamStore(default_root(f"bench-params-{time.monotonic_ns()}"))
    threads = torch.get_num_threads()
    times: dict[str, list[float]] = {"memcpy": [], "publish": [], "load": [], "load_into": []}
    try:
        version = 0
        cold_publish = timed(lambda: store.publish("policy", 0, src, HF_CFG))
        argv = [
            sys.executable,
            "-c",
            COLD,
            str(store.root),
            str(threads),
            json.dumps({k: list(s) for k, s in shapes.items()}),
        ]
        colds = [
            json.loads(
                subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
                .stdout.strip()
                .splitlines()[-1]
            )
            for _ in range(args.cold)
        ]

        def publish() -> None:
            store.publish("policy", version, src, HF_CFG)
            store.gc("policy", keep=1)

        def load() -> None:
            _, _, views = store.load("policy")
            for k, d in dst.items():
                d.copy_(views[k])

        for rep in range(args.reps + 1):  # the first round warms up and is not counted
            version += 1
            round_ = {
                "memcpy": timed(lambda: dst_flat.copy_(src_flat)),
                "publish": timed(publish),
                "load": timed(load),
                "load_into": timed(lambda: store.load_into("policy", dst)),
            }
            if rep:
                for k, t in round_.items():
                    times[k].append(t)
        if not torch.equal(dst_flat, src_flat):
            raise SystemExit("bench/params.py: loaded parameters differ from the published ones")
    finally:
        store.cleanup()
    gbps = {k: nbytes / statistics.median(v) / 1e9 for k, v in times.items()}
    for k, v in times.items():
        print(
            f"{k:10s} median {statistics.median(v) * 1e3:8.1f} ms  {gbps[k]:6.2f} GB/s  "
            f"(all: {', '.join(f'{t * 1e3:.0f}' for t in v)} ms)"
        )
    cold = {k: statistics.median(c[k] for c in colds) for k in ("load_s", "import_s")}
    cold_ms = ", ".join(f"{c['load_s'] * 1e3:.0f}" for c in colds)
    print(
        f"cold publish {cold_publish * 1e3:.0f} ms; cold load in a fresh process {cold_ms} ms "
        f"(+ {cold['import_s']:.2f} s interpreter and imports)"
    )
    print(
        json.dumps(
            {
                "bench": "params",
                "bytes": nbytes,
                "params": numel,
                "tensors": len(shapes),
                "threads": threads,
                "reps": args.reps,
                "publish_gbps": round(gbps["publish"], 3),
                "publish_cold_gbps": round(nbytes / cold_publish / 1e9, 3),
                "load_gbps": round(gbps["load"], 3),
                "load_into_gbps": round(gbps["load_into"], 3),
                "memcpy_gbps": round(gbps["memcpy"], 3),
                "load_vs_memcpy": round(gbps["load"] / gbps["memcpy"], 3),
                "load_into_vs_memcpy": round(gbps["load_into"] / gbps["memcpy"], 3),
                "publish_vs_memcpy": round(gbps["publish"] / gbps["memcpy"], 3),
                "cold_load_s": round(cold["load_s"], 4),
                "cold_import_s": round(cold["import_s"], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
