"""What a discriminative reward model (``Graph.reward_model``) costs against a generative judge
(``Graph.judge``) on the same body: conversations of the same length scored by the score role's
forward (``worker/reward_scoring.sequence_scores``: one pass, the score head at the last token,
batches of ``micro_batch_tokens``), and judged by the embedded engine (``TorchEngine``: the
same conversation prefilled, then a verdict of ``--verdict-tokens`` decoded, greedy, never
stopping early, in continuous batches of ``--batch``).

Random weights of a Qwen2.5-0.5B shape (``--layers`` of its 24; reward models such as
Skywork-Reward's are Qwen or Llama bodies with a score head); a verdict's cost is its length
whatever it says. Each variant runs ``--rounds`` times, alternating the order; the figures are
medians.

    python bench/reward_model_speed.py [--layers 4] [--conversations 16] [--tokens 256] \
        [--verdict-tokens 8,64] [--batch 64] [--rounds 3] [--threads 2]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import msgspec
import torch

from pivotflow.engines.base import GenerationRequest, SamplingParams
from pivotflow.engines.torch.engine import TorchEngine
from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.worker.reward_scoring import sequence_scores
from pivotflow.worker.train_role import pad_sequences

MICRO_BATCH_TOKENS = 4096  # the score role's default budget (TrainConfig.micro_batch_tokens)


def shape(args: argparse.Namespace) -> ModelConfig:
    # Qwen2.5-0.5B's widths and vocabulary (config.json of Qwen/Qwen2.5-0.5B), its depth aside
    return ModelConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                       num_hidden_layers=args.layers, num_attention_heads=14,
                       num_key_value_heads=2, max_position_embeddings=32768,
                       tie_word_embeddings=True)


def conversations(cfg: ModelConfig, n: int, tokens: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, cfg.vocab_size, (tokens,), generator=g).tolist() for _ in range(n)]


def reward_model_pass(cfg: ModelConfig, seqs: list[list[int]]) -> float:
    """Seconds to score every sequence, micro-batches of MICRO_BATCH_TOKENS padded positions."""
    torch.manual_seed(0)
    model = Decoder(msgspec.structs.replace(cfg, num_labels=1)).eval()
    per_batch = max(1, MICRO_BATCH_TOKENS // max(len(s) for s in seqs))
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(seqs), per_batch):
            scores = sequence_scores(model, pad_sequences(seqs[i:i + per_batch]))
            assert scores.shape == (len(seqs[i:i + per_batch]),)
    return time.perf_counter() - t0


def judge_pass(cfg: ModelConfig, seqs: list[list[int]], verdict: int, batch: int) -> float:
    """Seconds to prefill every sequence and decode ``verdict`` tokens for each (no stop id: a
    verdict's length is fixed here), in the embedded engine's continuous batches."""
    torch.manual_seed(0)
    engine = TorchEngine(cfg, max_batch=batch, max_seq_len=max(map(len, seqs)) + verdict + 1)
    weights = Decoder(cfg).state_dict()
    weights.pop("lm_head.weight", None)  # (tied: the embedding is the head)
    engine.load_weights(weights, version=0)
    params = SamplingParams(temperature=0.0, max_tokens=verdict)
    requests = [GenerationRequest(f"j{i}", s, params) for i, s in enumerate(seqs)]
    t0 = time.perf_counter()
    outs = engine.generate(requests)
    elapsed = time.perf_counter() - t0
    assert all(len(o.token_ids) == verdict for o in outs)
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=256, help="a conversation's length")
    ap.add_argument("--verdict-tokens", default="8,64")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = shape(args)
    seqs = conversations(cfg, args.conversations, args.tokens)
    verdicts = [int(v) for v in args.verdict_tokens.split(",")]
    variants: list[tuple[str, Any]] = [("reward_model", lambda: reward_model_pass(cfg, seqs))]
    variants += [(f"judge_{v}", lambda v=v: judge_pass(cfg, seqs, v, args.batch))
                 for v in verdicts]
    times: dict[str, list[float]] = {name: [] for name, _ in variants}
    for r in range(args.rounds):
        for name, fn in variants if r % 2 == 0 else variants[::-1]:
            times[name].append(fn())
            print(f"round {r}: {name:14s} {times[name][-1]:7.3f} s", file=sys.stderr, flush=True)
    per_s = {name: args.conversations / statistics.median(t) for name, t in times.items()}
    for name, rate in per_s.items():
        print(f"{name:14s} {rate:9.1f} conversations/s ({rate / per_s['reward_model']:.3f}x the "
              "reward model)")
    print(json.dumps({
        "bench": "reward_model_speed", "command": " ".join(["python", *sys.argv]),
        "shape": {k: getattr(cfg, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers")},
        "conversations": args.conversations, "tokens": args.tokens, "rounds": args.rounds,
        "seconds": times, "conversations_per_s": per_s,
        "judge_over_reward_model": {n: per_s[n] / per_s["reward_model"] for n in per_s
                                    if n != "reward_model"},
    }))


if __name__ == "__main__":
    main()
