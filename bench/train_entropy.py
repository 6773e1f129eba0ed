"""What the entropy metric costs a train step: ``TrainRole.train`` with the entropy reported
(every step does, since 2026-12-05) against the same step without it, alternated in one sitting.

The entropy is a vocabulary-wide pass over each trained position's logits (softmax, product,
sum), detached and in chunks (``response_scoring.ENTROPY_CHUNK``), so its cost grows with the
vocabulary and not with the model's depth: the worst case is a shallow model with a large
vocabulary. The default is Qwen2.5's vocabulary (151,936) on a small random Qwen2 (hidden 256,
2 layers), where the logits are most of the step; ``--vocab`` and ``--layers`` move it.

    python bench/train_entropy.py [--vocab 151936] [--hidden 256] [--layers 2] \
        [--seqs 8] [--prompt 32] [--response 96] [--reps 5] [--threads 1]

"Without" runs the step as it ran before the metric: the same forward through
``response_scoring.response_logprobs`` (the reference role's path), no entropy. Prints the
median step time of each, their ratio and the metric's share of the step; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.engines.torch.weights import config_to_hf
from pivotflow.params.shm_store import ShmParamStore
from pivotflow.protocol import TrainSeq, TrainStep
from pivotflow.worker import response_scoring, train_role
from pivotflow.worker.train_role import TrainRole


def without_entropy(model: Decoder, batch: dict[str, torch.Tensor], entropy: str,
                    chunk: int = 0) -> tuple[torch.Tensor, None]:
    """The step's forward as before the metric: logprobs only."""
    return response_scoring.response_logprobs(model, batch, chunk), None


def step_message(step: int, args: argparse.Namespace) -> TrainStep:
    g = torch.Generator().manual_seed(step)
    seqs = []
    for i in range(args.seqs):
        ids = torch.randint(3, args.vocab, (args.prompt + args.response,), generator=g).tolist()
        seqs.append(TrainSeq(job_id=i, prompt_ids=ids[:args.prompt],
                             response_ids=ids[args.prompt:],
                             logprobs=[-12.0] * args.response, versions=[step] * args.response,
                             advantage=1.0 if i % 2 else -1.0))
    return TrainStep(step=step, seqs=seqs, rank=0, world=1, epoch=1, rendezvous="",
                     total_tokens=args.seqs * args.response, total_seqs=args.seqs,
                     any_signal=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--response", type=int, default=96)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = ModelConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                      intermediate_size=args.hidden * 3, num_hidden_layers=args.layers,
                      num_attention_heads=max(args.hidden // 64, 1),
                      num_key_value_heads=max(args.hidden // 128, 1),
                      max_position_embeddings=args.prompt + args.response + 1)
    times: dict[str, list[float]] = {"with": [], "without": []}
    with tempfile.TemporaryDirectory(prefix="pf-entropy-") as root:
        store = ShmParamStore(Path(root))
        torch.manual_seed(0)
        store.publish("policy", 0, Decoder(cfg).state_dict(), config_to_hf(cfg, torch.float32))
        role = TrainRole(store, "policy", {"lr": 1e-5, "micro_batch_tokens": 1 << 20})
        forward = train_role.response_logprobs_entropy
        role.train(step_message(0, args))  # warm-up (allocator, first publish)
        for rep in range(args.reps):
            for kind in ("with", "without") if rep % 2 == 0 else ("without", "with"):
                train_role.response_logprobs_entropy = (  # type: ignore[assignment]
                    forward if kind == "with" else without_entropy)
                msg = step_message(rep + 1, args)
                t0 = time.perf_counter()
                stats = role.train(msg).stats
                times[kind].append(time.perf_counter() - t0)
                assert ("entropy" in stats) is (kind == "with")
        train_role.response_logprobs_entropy = forward
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "bench": "train_entropy",
        "command": " ".join(["python", *sys.argv]),
        "vocab": args.vocab, "hidden": args.hidden, "layers": args.layers,
        "trained_positions": args.seqs * args.response, "threads": args.threads,
        "step_s_with": med["with"], "step_s_without": med["without"],
        "with_over_without": med["with"] / med["without"],
        "metric_share_of_step": 1 - med["without"] / med["with"],
        "reps": args.reps, "all_s": times,
    }
    print(f"step with the entropy metric {med['with']:.3f} s, without {med['without']:.3f} s "
          f"({result['with_over_without']:.3f}x; vocab {args.vocab}, {args.layers} layers)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
