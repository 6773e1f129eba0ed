"""What the checkpoint checksums cost: a run checkpoint of the built-in policy written with its
per-file SHA-256 (what ``checkpoints.write`` does), the hashing timed apart, and the verify a
resume does (``checkpoints.read``), beside SHA-256 and BLAKE2b over the same bytes.

Run: python bench/checkpoint_checksum.py [--reps 7] [--model DIR]

The checkpoint is what a run of graphs/grpo_rule.py writes: the built-in policy's weights (its
cached HF folder, trained first if missing), an AdamW state of two float32 moments per
parameter, and a controller state. Per repetition: checkpoints.write (written_s and its
checksum_s share, from the manifest), then checkpoints.read (verify and load). Medians.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from pivotflow import checkpoints
from pivotflow.controller.snapshot import ControllerState
from pivotflow.params.hf_folder import read_folder
from pivotflow.params.shm_store import ShmParamStore, default_root


def builtin_policy() -> Path:
    from pivotflow.tasks.cache import ensure_models

    return ensure_models(seed=0)[0]


def state(version: int) -> ControllerState:
    return ControllerState(version=version, tokens_generated=0, ledger={}, settled_below=0,
                           settled_above=[], open_groups={}, next_sample=0,
                           source_rng=[3, [0] * 625, None], problems_cursor=0,
                           problems_rng=[3, [0] * 625, None], samples=[])


def throughput(name: str, data: bytes) -> float:
    t0 = time.perf_counter()
    hashlib.new(name, data).hexdigest()
    return len(data) / (time.perf_counter() - t0) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--model", type=Path, default=None, help="an HF folder (default: built-in)")
    args = ap.parse_args()
    model = args.model or builtin_policy()
    config, tensors = read_folder(model)
    optim = {f"{k}.{m}": torch.zeros_like(v, dtype=torch.float32) + 0.5
             for k, v in tensors.items() for m in ("exp_avg", "exp_avg_sq")}
    store = ShmParamStore(default_root(f"bench-ckpt-{time.time_ns()}"))
    written, hashed, verified = [], [], []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(1, args.reps + 1):
                store.publish("policy", rep, tensors, config)
                store.publish("policy.optim", rep, optim, config)
                path = checkpoints.write(Path(tmp), "policy", store, state(rep),
                                         tokenizer_dir=model)
                manifest = json.loads((path / "manifest.json").read_text())
                written.append(manifest["written_s"])
                hashed.append(manifest["checksum_s"])
                t0 = time.perf_counter()
                checkpoints.read(path)
                verified.append(time.perf_counter() - t0)
                store.gc("policy", keep=1)
                store.gc("policy.optim", keep=1)
            nbytes = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            blob = b"".join(p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file())
    finally:
        store.cleanup()
    w, h = statistics.median(written), statistics.median(hashed)
    print(json.dumps({
        "bench": "checkpoint_checksum", "model": str(model), "checkpoint_bytes": nbytes,
        "reps": args.reps, "write_s": round(w, 4), "checksum_s": round(h, 4),
        "checksum_share_of_write": round(h / w, 3),
        "read_verify_s": round(statistics.median(verified), 4),
        "sha256_gb_s": round(throughput("sha256", blob), 3),
        "blake2b_gb_s": round(throughput("blake2b", blob), 3)}))


if __name__ == "__main__":
    main()
