"""What a checkpoint costs the controller in memory: the private memory a fresh process adds
while it writes one (``pivotflow.checkpoints.write``: the policy's Hugging Face folder and
``optimizer.safetensors``), then resumes from it, of a Qwen2.5-0.5B-shaped random model (its
widths and 151,936-token vocabulary, ``--layers`` of its 24 layers) and its AdamW state (two
float32 moments a weight), the state stored as the replicated layout's whole entry (``whole``,
also what a resume publishes) or as two trainers' shards (``shards``, ``zero_stage=1``).

The store's entries are views of its shared memory, so writing them costs the writer no
private memory: safetensors' ``save_file`` (the writer before 12-05, still the weights') and
the streamed writer alike. A sharded state exists whole nowhere: it is joined one entry at a
time as the streamed writer (``params/safetensors_stream.py``) reads it, so the write holds
the largest entry, not the state (joined first for ``save_file``, it would hold all of it).
A resume (``resume_*``) reads the files with safetensors' ``load_file``, which maps them: its
private memory stays flat as well. To measure the code before, run this file against an older
checkout
(``PYTHONPATH=OLD python bench/checkpoint_memory.py --variants whole``: it had no shards).

    python bench/checkpoint_memory.py [--layers 8] [--rounds 2] [--variants whole,shards]

Each variant runs in a fresh process (spawned), rounds alternating the order; per variant the
median of ``anon_peak_added_mib`` (the most private memory the write added, sampled every
5 ms: what the write costs), ``peak_added_mib`` (the resident high-water mark's rise, which
also counts the store's shared-memory pages the write reads: they cost nothing of their own)
and ``write_s``, with the bytes written; then the same for a resume of that checkpoint
(``checkpoints.read`` and ``checkpoints.publish`` into a fresh store: ``resume_*``). The last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODELS = {"whole": "policy", "shards": "sharded"}  # variant -> the store name it writes


def status_mib(key: str) -> float:
    """A ``/proc/self/status`` figure (VmRSS, RssAnon) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    return 0.0


class AnonPeak:
    """The most private (anonymous) memory the process held while it ran, sampled every 5 ms:
    the resident high-water mark also counts the store's shared-memory pages a write reads,
    which cost no memory of their own."""

    def __init__(self) -> None:
        import threading

        self.most = status_mib("RssAnon")
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.done.wait(0.005):
            self.most = max(self.most, status_mib("RssAnon"))

    def stop(self) -> float:
        self.done.set()
        self.thread.join()
        return max(self.most, status_mib("RssAnon"))


def fill_store(root: Path, layers: int, variants: list[str]) -> dict[str, float]:
    """Publish the model (version 1) and its state, whole and/or in two shards; their MiB."""
    import torch

    from pivotflow.engines.torch.model import Decoder, ModelConfig
    from pivotflow.engines.torch.weights import config_to_hf
    from pivotflow.params.shm_store import ShmParamStore

    cfg = ModelConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                      num_hidden_layers=layers, num_attention_heads=14, num_key_value_heads=2,
                      max_position_embeddings=4096, tie_word_embeddings=True)
    hf = config_to_hf(cfg, torch.float32)
    store = ShmParamStore(root)
    torch.manual_seed(0)
    model = Decoder(cfg)
    weights = model.state_dict()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    sizes = {"weights_mib": sum(t.numel() * 4 for t in weights.values()) / 2**20,
             "state_mib": sum(p.numel() * 8 for _, p in named) / 2**20}
    for variant in variants:
        store.publish(MODELS[variant], 1, weights, hf)
    if "whole" in variants:
        state = {}
        for n, p in named:
            state[f"{n}.exp_avg"] = torch.randn(p.shape)
            state[f"{n}.exp_avg_sq"] = torch.rand(p.shape)
            state[f"{n}.step"] = torch.tensor(1.0)
        store.publish("policy.optim", 1, state, hf)
        del state
    if "shards" in variants:
        from pivotflow.params.flat_layout import FlatLayout
        from pivotflow.params.optim_entries import chunk_name, publish_part

        bucket = 1 << 24
        flat = FlatLayout([p.numel() for _, p in named], bucket)
        for rank in range(2):
            tensors = {chunk_name(k, b): torch.randn(flat.chunk(b, 2))
                       for k in ("exp_avg", "exp_avg_sq") for b in range(len(flat.buckets))}
            shard = {"world": 2, "rank": rank, "epoch": 1, "steps": 1, "bucket_elems": bucket,
                     "keys": ["exp_avg", "exp_avg_sq"],
                     "params": [[n, list(p.shape)] for n, p in named]}
            publish_part(store, "sharded", 1, tensors, shard, hf, keep=2)
    return sizes


def writer(root: str, variant: str, out: Any) -> None:
    from pivotflow import checkpoints
    from pivotflow.controller.snapshot import ControllerState
    from pivotflow.params.shm_store import ShmParamStore

    store = ShmParamStore(root)
    state = ControllerState(version=1, tokens_generated=0, ledger={}, settled_below=0,
                            settled_above=[], open_groups={}, next_sample=0,
                            source_rng=[3, [0] * 625, None], problems_cursor=0,
                            problems_rng=[3, [0] * 625, None], samples=[])
    run = Path(tempfile.mkdtemp(prefix="pf-ckpt-"))
    try:
        before, anon_before = status_mib("VmRSS"), status_mib("RssAnon")
        sampler = AnonPeak()
        t0 = time.perf_counter()
        path = checkpoints.write(run, MODELS[variant], store, state)
        write_s = time.perf_counter() - t0
        anon_peak = sampler.stop()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        written = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20
        # then what a resume does with it: read the checkpoint, publish it into a fresh store
        fresh = ShmParamStore(Path(root + "-resumed"))
        resume_before = status_mib("RssAnon")
        sampler = AnonPeak()
        t0 = time.perf_counter()
        checkpoints.publish(checkpoints.read(path), MODELS[variant], fresh)
        resume_s = time.perf_counter() - t0
        resume_peak = sampler.stop()
        fresh.cleanup()
        out.put({"variant": variant, "peak_added_mib": peak - before,
                 "anon_peak_added_mib": anon_peak - anon_before, "write_s": write_s,
                 "written_mib": written, "rss_before_mib": before,
                 "resume_anon_peak_added_mib": resume_peak - resume_before,
                 "resume_s": resume_s})
    finally:
        shutil.rmtree(run, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default="whole,shards", help="of whole, shards")
    args = ap.parse_args()
    variants = args.variants.split(",")
    if unknown := set(variants) - set(MODELS):
        ap.error(f"--variants: {sorted(unknown)} unknown; of {sorted(MODELS)}")
    root = Path(tempfile.mkdtemp(prefix="pf-ckpt-store-", dir="/dev/shm"))
    try:
        sizes = fill_store(root, args.layers, variants)
        ctx = mp.get_context("spawn")
        rows: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for rnd in range(args.rounds):
            for variant in (variants if rnd % 2 == 0 else variants[::-1]):
                q = ctx.Queue()
                proc = ctx.Process(target=writer, args=(str(root), variant, q))
                proc.start()
                row = q.get(timeout=1800)
                proc.join(60)
                rows[variant].append(row)
                print(f"round {rnd} {variant}: private +{row['anon_peak_added_mib']:.0f} MiB "
                      f"(resident +{row['peak_added_mib']:.0f}), resume private "
                      f"+{row['resume_anon_peak_added_mib']:.0f} MiB "
                      f"({row['resume_s']:.1f} s), "
                      f"{row['write_s']:.1f} s, {row['written_mib']:.0f} MiB written",
                      file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result: dict[str, Any] = {
        "bench": "checkpoint_memory", "layers": args.layers, "rounds": args.rounds, **sizes,
        "variants": {v: {k: statistics.median(r[k] for r in rs)
                         for k in ("anon_peak_added_mib", "peak_added_mib", "write_s",
                                   "written_mib", "resume_anon_peak_added_mib", "resume_s")}
                     for v, rs in rows.items()}}
    for figures in result["variants"].values():  # the write held this much of what it wrote
        figures["anon_peak_over_written"] = figures["anon_peak_added_mib"] / figures["written_mib"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
