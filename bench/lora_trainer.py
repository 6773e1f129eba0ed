"""What LoRA (``lora_rank``) changes in the trainer: the real ``TrainRole`` step (forward,
backward, AdamW, publishing the policy and its optimizer state to the parameter store) on a
Qwen2.5-0.5B-shaped random model, every weight trained against a rank-r update of every linear
layer, each variant in a fresh process. ``lora_kl`` adds a KL penalty with no reference logprobs
on the samples, so the trainer scores each micro-batch once more with the adapters left out
(the base as the reference): what that extra forward costs against a reference pool's.

Reported per variant: the parameters AdamW trains, the optimizer state a step publishes
(``<model>.optim``: AdamW's moments, and under LoRA the adapters; every step writes it, so a
trainer that leaves never takes it along), the process's peak resident memory, and the
median step time once the store reuses its buffers (from the fourth step). ``--rounds`` repeats
the variants, alternating their order (this machine's speed moves between minutes: a ratio
wants them side by side).

    python bench/lora_trainer.py [--layers 4] [--rank 8] [--seqs 4] [--prompt 64] \
        [--response 192] [--steps 6] [--rounds 2] [--threads 2] \
        [--store-dir DIR]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

VARIANTS = ("full", "lora", "lora_kl")
# Steps timed from here on: the store keeps three policy versions and two optimizer states and
# writes later ones into the buffers of collected versions (pages tmpfs already has, about 2x
# faster than new ones); the first steps also fault in AdamW's state.
STEADY = 3


def one_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """One fresh process: build the store and the trainer, take ``--steps`` steps."""
    import torch

    from pivotflow.controller.train_tokens import valid_tokens
    from pivotflow.engines.torch.model import Decoder, ModelConfig
    from pivotflow.engines.torch.weights import config_to_hf
    from pivotflow.params.optim_entries import load_optim_state
    from pivotflow.params.shm_store import ShmParamStore, default_root
    from pivotflow.protocol import TrainSeq, TrainStep
    from pivotflow.worker.train_role import TrainRole

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    # Qwen2.5-0.5B's shape (config.json of Qwen/Qwen2.5-0.5B), its depth aside
    cfg = ModelConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                      num_hidden_layers=args.layers, num_attention_heads=14,
                      num_key_value_heads=2, max_position_embeddings=32768,
                      tie_word_embeddings=True)
    # /dev/shm, as a run's store; at 24 layers full training's versions (three policies of 2
    # GB, two optimizer states of 3.8 GB, a spare of each) outgrow a 24 GB machine beside the
    # trainer: --store-dir puts them on disk
    root = default_root() if not args.store_dir else Path(args.store_dir) / f"lora-{variant}"
    try:
        store = ShmParamStore(root)
        weights = Decoder(cfg).state_dict()
        weights.pop("lm_head.weight")  # (tied)
        store.publish("policy", 0, weights, config_to_hf(cfg, torch.float32))
        del weights
        options: dict[str, Any] = {"lr": 1e-5}
        if variant.startswith("lora"):
            options.update(lora_rank=args.rank, lora_alpha=2.0 * args.rank, lr=1e-4)
        if variant == "lora_kl":
            options.update(kl_coef=0.04)
        role = TrainRole(store, "policy", options)
        trained = sum(p.numel() for p in role.model.parameters() if p.requires_grad)
        g = torch.Generator().manual_seed(1)
        times = []
        for step in range(args.steps):
            seqs = []
            for i in range(args.seqs):
                ids = torch.randint(3, 151936, (args.prompt + args.response,),
                                    generator=g).tolist()
                seqs.append(TrainSeq(job_id=i, prompt_ids=ids[:args.prompt],
                                     response_ids=ids[args.prompt:],
                                     logprobs=[-12.0] * args.response,
                                     versions=[step] * args.response,
                                     advantage=1.0 if i % 2 else -1.0))
            msg = TrainStep(step=step, seqs=seqs, rank=0, world=1, epoch=1, rendezvous="",
                            total_tokens=sum(valid_tokens(s) for s in seqs),
                            total_seqs=len(seqs))
            t0 = time.perf_counter()
            role.train(msg)
            times.append(time.perf_counter() - t0)
        # what the last step wrote to the store beside the policy (the state, the adapters)
        state = load_optim_state(role.store, "policy", role.version)
        optim_bytes = sum(state[k].numel() * state[k].element_size() for k in state)
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"variant": variant, "trained_params": trained, "optim_state_mb": optim_bytes / 2**20,
            "peak_rss_mb": peak_mb, "step_s": times[STEADY:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--response", type=int, default=192)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--store-dir", default="", help="the parameter store's folder (default: "
                    "/dev/shm, as a run's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)  # (a child process)
    args = ap.parse_args()
    if args.steps <= STEADY:
        ap.error(f"--steps must be more than {STEADY}: the first {STEADY} are not timed")
    if args.one:
        print(json.dumps(one_variant(args.one, args)))
        return
    passed = sys.argv[1:]
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for v in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            out = subprocess.run([sys.executable, __file__, *passed, "--one", v], check=True,
                                 capture_output=True, text=True).stdout
            runs[v].append(json.loads(out.strip().splitlines()[-1]))
            x = runs[v][-1]
            print(f"round {r}, {v:4s}: trains {x['trained_params'] / 1e6:7.2f} M parameters; "
                  f"optimizer state {x['optim_state_mb']:7.1f} MB a step; peak RSS "
                  f"{x['peak_rss_mb']:6.0f} MB; steps {', '.join(f'{t:.2f}' for t in x['step_s'])}"
                  " s", flush=True)
    rows = {v: {**runs[v][0], "peak_rss_mb": statistics.median(x["peak_rss_mb"] for x in runs[v]),
                "step_s": statistics.median(t for x in runs[v] for t in x["step_s"]),
                "rounds": runs[v]} for v in VARIANTS}
    full, lora = rows["full"], rows["lora"]
    print(json.dumps({
        "bench": "lora_trainer", "command": " ".join(["python", "bench/lora_trainer.py",
                                                      *passed]),
        "layers": args.layers, "rank": args.rank, "variants": rows,
        "lora_over_full": {k: lora[k] / full[k] for k in
                           ("trained_params", "optim_state_mb", "peak_rss_mb", "step_s")},
        # the base as the reference: the step with the KL's extra forward, over without
        "lora_kl_step_over_lora": rows["lora_kl"]["step_s"] / lora["step_s"],
    }))


if __name__ == "__main__":
    main()
