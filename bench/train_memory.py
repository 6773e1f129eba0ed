"""What the trainer's memory knobs save and cost: the peak memory and the time of one
micro-batch's forward, loss and backward (what ``TrainRole.train`` runs per micro-batch; the
optimizer step and the publish are the same under every knob) on a Qwen2.5-0.5B-shaped random
model: its widths and 151,936-token vocabulary, fewer layers (``--layers 24`` is the whole).

Variants, each in a fresh process (the peak is the process's high-water mark, less what it held
before the pass: the model, its gradients and the batch):

* ``before``: the forward as it ran before 2026-12-05, the logits of every position (prompt and
  padding included) computed, then gathered (kept here, in the bench, to be measured against);
* ``plain``: the head on the response tokens only (the trainer's path now, with no knob);
* ``chunk``: ``logits_chunk_tokens`` = ``--chunk``;
* ``checkpointing``: ``gradient_checkpointing``;
* ``both``.

    python bench/train_memory.py [--layers 4] [--seqs 1] [--prompt 128] [--response 896] \
        [--chunk 256] [--rounds 2] [--threads 2] [--device cuda] [--bf16]

On a GPU (``--device cuda``) the peak is the CUDA allocator's, over what it held before the
pass; ``--bf16`` runs the pass under bf16 autocast over the float32 weights, as the trainer
does with ``--set dtype=bfloat16``.

The rounds alternate the variants' order; times are medians over rounds and passes. The last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

VARIANTS = ("before", "plain", "chunk", "checkpointing", "both")


def model_config(args: argparse.Namespace) -> Any:
    from pivotflow.engines.torch.model import ModelConfig

    # Qwen2.5-0.5B's shape (config.json of Qwen/Qwen2.5-0.5B), its depth aside
    return ModelConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                       num_hidden_layers=args.layers, num_attention_heads=14,
                       num_key_value_heads=2, max_position_embeddings=32768,
                       tie_word_embeddings=True)


def before_forward(model: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
    """The trainer's forward before 2026-12-05: every position's logits, then gathered."""
    import torch

    from pivotflow.engines.torch.model import entropy_detached, pick_targets
    from pivotflow.worker.response_scoring import ENTROPY_CHUNK

    logits = model(batch["ids"], attention_mask=batch["attn"])
    pos = batch["gather"].unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    logp_all = torch.log_softmax(logits.gather(1, pos).float(), dim=-1)
    return pick_targets(logp_all, batch["targets"]), entropy_detached(logp_all, ENTROPY_CHUNK)


def one_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """One fresh process's measurement: the first pass's peak, then the passes' times."""
    import torch

    from pivotflow.engines.torch.model import Decoder
    from pivotflow.protocol import TrainSeq
    from pivotflow.rl import policy_loss
    from pivotflow.worker.response_scoring import response_logprobs_entropy
    from pivotflow.worker.train_role import pack

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    model = Decoder(model_config(args)).to(device).train()
    model.gradient_checkpointing = variant in ("checkpointing", "both")
    chunk = args.chunk if variant in ("chunk", "both") else 0
    for p in model.parameters():  # the gradients exist before the pass: not its memory
        p.grad = torch.zeros_like(p)
    g = torch.Generator().manual_seed(1)
    seqs = []
    for i in range(args.seqs):
        ids = torch.randint(3, 151936, (args.prompt + args.response,), generator=g).tolist()
        seqs.append(TrainSeq(job_id=i, prompt_ids=ids[:args.prompt],
                             response_ids=ids[args.prompt:], logprobs=[-12.0] * args.response,
                             versions=[0] * args.response, advantage=1.0 if i % 2 else -1.0))
    batch = {k: v.to(device) for k, v in pack(seqs).items()}
    # bf16 autocast over float32 weights, as the trainer computes with --set dtype=bfloat16
    compute = (torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16
               else contextlib.nullcontext())

    def one_pass() -> float:
        t0 = time.perf_counter()
        with compute:
            if variant == "before":
                logp, entropy = before_forward(model, batch)
            else:
                logp, entropy = response_logprobs_entropy(model, batch, "report", chunk)
        loss, _ = policy_loss(logp, batch["old"], batch["adv"], batch["mask"], entropy=entropy)
        loss.backward()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    if cuda:  # the allocator's own peak over what the weights, gradients and batch hold
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        times = [one_pass()]
        peak_mb = (torch.cuda.max_memory_allocated() - held) / 2**20
        times += [one_pass() for _ in range(args.passes - 1)]
        return {"variant": variant, "peak_mb": peak_mb, "held_mb": held / 2**20,
                "pass_s": times, "first_pass_page_faults": 0}
    before = resource.getrusage(resource.RUSAGE_SELF)
    times = [one_pass()]
    after = resource.getrusage(resource.RUSAGE_SELF)
    times += [one_pass() for _ in range(args.passes - 1)]
    # page faults of the first pass (memory touched for the first time is faulted in and
    # zeroed page by page): to tell a footprint's cost from the arithmetic's
    return {"variant": variant, "peak_mb": (after.ru_maxrss - before.ru_maxrss) / 1024,
            "held_mb": before.ru_maxrss / 1024, "pass_s": times,
            "first_pass_page_faults": after.ru_minflt - before.ru_minflt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seqs", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--response", type=int, default=896)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--passes", type=int, default=3, help="per process (the first one's peak)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (the allocator's peak)")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast, as --set dtype=bf16")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)  # (a child process)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_variant(args.one, args)))
        return
    variants = args.variants.split(",")
    child_args = [f"--{k}={getattr(args, k)}" for k in (
        "layers", "seqs", "prompt", "response", "chunk", "passes", "threads", "device")]
    child_args += ["--bf16"] if args.bf16 else []
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            out = subprocess.run([sys.executable, __file__, *child_args, "--one", v],
                                 capture_output=True, text=True, check=True)
            runs[v].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r}: {v:14s} peak {runs[v][-1]['peak_mb']:8.0f} MB, passes "
                  + ", ".join(f"{t:.2f}" for t in runs[v][-1]["pass_s"]) + " s", flush=True)
    peak = {v: statistics.median(x["peak_mb"] for x in runs[v]) for v in variants}
    pass_s = {v: statistics.median(t for x in runs[v] for t in x["pass_s"]) for v in variants}
    faults = {v: statistics.median(x["first_pass_page_faults"] for x in runs[v])
              for v in variants}
    base = "before" if "before" in variants else variants[0]
    result = {
        "bench": "train_memory",
        "command": " ".join(["python", *sys.argv]),
        "model": "Qwen2.5-0.5B-shaped, random", "layers": args.layers,
        "positions": args.seqs * (args.prompt + args.response),
        "response_tokens": args.seqs * args.response, "chunk": args.chunk,
        "threads": args.threads, "device": args.device, "bf16": args.bf16,
        "peak_mb": peak, "pass_s": pass_s, "first_pass_page_faults": faults,
        f"peak_over_{base}": {v: peak[v] / peak[base] for v in variants},
        f"time_over_{base}": {v: pass_s[v] / pass_s[base] for v in variants},
        "runs": runs,
    }
    for v in variants:
        print(f"{v:14s} peak {peak[v]:8.0f} MB ({peak[v] / peak[base]:.2f}x), "
              f"pass {pass_s[v]:.2f} s ({pass_s[v] / pass_s[base]:.2f}x)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
