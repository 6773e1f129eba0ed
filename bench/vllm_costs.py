"""What the vLLM engine costs a worker, beside the embedded engine: start-up, weight updates
from the parameter store, and release/resume (a shift), on a ~25M-parameter Qwen2.

The model has bench/engine.py's bpe25m shape (hidden 512, 8 layers, 8 heads of 64, 2 KV heads,
tied embeddings, vocab 8192) with random weights, saved by transformers. vLLM starts as a
worker starts it (``load_format="dummy"``, then version 0 from the store inside its worker);
each update publishes a new version to a ``ShmParamStore`` and times ``load_version`` into
vLLM (the worker maps the store; a path and a version cross vLLM's socket) and into the
embedded engine (zero-copy tensors), side by side, as a ratio. After each update both engines
decode the same prompts greedily: ``tokens_match_fraction`` says they agree (fp32), so the
update really landed. Release/resume on CPU shut vLLM down and start it again.

Run it where vLLM is installed (.ci/run's venv):

    /work/vllm-venv/bin/python bench/vllm_costs.py [--updates 5] [--threads 1] [--out FILE]

Progress goes to stderr; one JSON object is the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

SHAPE = {"hidden_size": 512, "intermediate_size": 1280, "num_hidden_layers": 8,
         "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 8192,
         "max_position_embeddings": 256, "tie_word_embeddings": True}  # fmt: skip
PROMPTS = [[(7 * i + 13 * j) % 8000 + 10 for j in range(16)] for i in range(8)]
NEW_TOKENS = 16
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"{time.perf_counter() - T0:7.1f}s {msg}", file=sys.stderr, flush=True)


def write_folder(path: Path) -> dict[str, Any]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE, eos_token_id=0, bos_token_id=0))
    model.save_pretrained(path)
    return {"params": sum(p.numel() for p in model.parameters())}


def perturbed(tensors: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in tensors.items()}


def greedy(engine: Any) -> list[list[int]]:
    from pivotflow.engines.base import GenerationRequest, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
    for i, p in enumerate(PROMPTS):
        engine.add_request(GenerationRequest(f"p{i}", list(p), params))
    got: dict[str, list[int]] = {}
    while engine.has_work():
        got.update((o.request_id, o.token_ids) for o in engine.step())
    return [got[f"p{i}"] for i in range(len(PROMPTS))]


def timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=5, help="weight updates to time")
    parser.add_argument("--threads", type=int, default=1, help="threads of each engine")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--no-mp", action="store_true",
                        help="skip timing a start with vLLM's own processes (the GPU default)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    t_import = time.perf_counter()
    import vllm

    import_s = time.perf_counter() - t_import  # a worker pays it once, before its first start

    from pivotflow.engines import load_version
    from pivotflow.engines.torch.engine import TorchEngine
    from pivotflow.engines.torch.weights import load_checkpoint
    from pivotflow.engines.vllm_engine import VllmEngine
    from pivotflow.params.shm_store import ShmParamStore

    load = os.getloadavg()
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="pivotflow-vllm-costs-") as tmp, \
            tempfile.TemporaryDirectory(prefix="pivotflow-vllm-costs-store-", dir=shm) as sdir:
        folder = Path(tmp) / "qwen2-25m"
        built = write_folder(folder)
        cfg, weights = load_checkpoint(folder)
        hf = json.loads((folder / "config.json").read_text())
        store = ShmParamStore(sdir)
        store.publish("policy", 0, weights, hf)
        max_len = len(PROMPTS[0]) + NEW_TOKENS
        ours = TorchEngine(cfg, max_batch=len(PROMPTS), max_seq_len=max_len)
        load_version(ours, store, "policy", 0)
        log(f"[vllm] {vllm.__version__}: starting on {built['params'] / 1e6:.1f}M parameters")
        theirs = VllmEngine(None, model_path=str(folder), dtype="float32", load_format="dummy",
                            max_model_len=max_len, max_num_seqs=len(PROMPTS),
                            threads=args.threads)  # fmt: skip
        _, first_load_s = timed(lambda: load_version(theirs, store, "policy", 0))
        log(f"[vllm] up in {theirs.startup_s:.1f} s, first load from the store {first_load_s:.3f} s")
        matches, vllm_s, torch_s, file_s = [], [], [], []
        for v in range(1, args.updates + 1):
            store.publish("policy", v, perturbed(weights, v), hf)
            vllm_s.append(timed(lambda v=v: load_version(theirs, store, "policy", v))[1])
            torch_s.append(timed(lambda v=v: load_version(ours, store, "policy", v))[1])
            a, b = greedy(ours), greedy(theirs)
            matches.append(sum(x == y for x, y in zip(a, b, strict=True)) / len(a))
            store.gc("policy", keep=2)  # as the run does: the store holds a few versions
            log(f"[update v{v}] vLLM {vllm_s[-1]:.3f} s, embedded {torch_s[-1]:.3f} s, "
                f"greedy tokens agree on {matches[-1]:.0%}")
        # the tensor path, for comparison: a safetensors file in /dev/shm the worker reads
        latest = store.load("policy", args.updates)[2]
        for _ in range(2):
            file_s.append(timed(lambda t=latest: theirs.load_weights(t, args.updates))[1])
        theirs.release_memory()
        theirs.resume_memory()
        _, reload_s = timed(lambda: load_version(theirs, store, "policy", None))
        after = greedy(theirs) == greedy(ours)
        log(f"[vllm] release {theirs.release_s:.1f} s, resume {theirs.resume_s:.1f} s, "
            f"reload {reload_s:.3f} s; same tokens after: {after}")
        theirs.shutdown()
        mp_startup_s = None
        if not args.no_mp:  # beside it, a start as on a GPU: engine core and worker spawned
            mp = VllmEngine(None, model_path=str(folder), dtype="float32", load_format="dummy",
                            max_model_len=max_len, max_num_seqs=len(PROMPTS),
                            threads=args.threads, distributed_executor_backend="mp")  # fmt: skip
            mp_startup_s = round(mp.startup_s, 2)
            log(f"[vllm] with its own processes: up in {mp_startup_s:.1f} s")
            mp.shutdown()
        store.cleanup()
    med_v, med_t = statistics.median(vllm_s), statistics.median(torch_s)
    result = {
        "bench": "vllm_costs", "vllm": vllm.__version__, "model": "qwen2", **built,
        "shape": SHAPE, "dtype": "float32", "threads": args.threads,
        "load_average": [round(x, 2) for x in load],
        "import_s": round(import_s, 2),
        "startup_s": round(theirs.startup_s, 2),
        "startup_own_processes_s": mp_startup_s,
        "first_load_from_store_s": round(first_load_s, 4),
        "update_from_store_s": {"median": round(med_v, 4), "min": round(min(vllm_s), 4)},
        "embedded_update_s": {"median": round(med_t, 4), "min": round(min(torch_s), 4)},
        "update_ratio_vllm_over_embedded": round(med_v / med_t, 1) if med_t else None,
        "update_through_shm_file_s": round(min(file_s), 4),
        "updates": args.updates,
        "tokens_match_fraction": round(statistics.mean(matches), 3),
        "release_s": round(theirs.release_s, 2), "resume_s": round(theirs.resume_s, 2),
        "reload_after_resume_s": round(reload_s, 4), "tokens_match_after_resume": after,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.perf_counter() - T0, 1),
    }  # fmt: skip
    line = json.dumps(result)
    if args.out:
        args.out.write_text(line + "\n")
    print(line)


if __name__ == "__main__":  # vLLM starts its engine core in a child process
    main()
