"""Qwen3.5's hybrid (gated DeltaNet on three layers of four), or Granite 4.0-H's (Mamba2 on
them: ``--family granite``), on the embedded engine against the same model with attention on
every layer: what a running sequence holds, prefill time and decode throughput, for the tree
on ``sys.path`` (``PYTHONPATH=<tree> python ...``).

    python bench/hybrid_attention.py [--family qwen3_5|granite] [--prompt-len 1024]
        [--new-tokens 32] [--repeats 2]

Model (random weights and prompt ids, float32, one thread): hidden 1024, MLP 2816, 8 layers;
gated attention of 8 heads of 128 on 2 KV heads (a quarter of each head rotating), DeltaNet
of 8 key and 8 value heads of 128 with a 4-tap convolution, layers 3 and 7 full in the hybrid
(Qwen3.5's pattern), every layer full in ``all_attention``. Granite: the same attention
(no rope, as Granite 4.0-H's) and MLP; Mamba2 of 32 heads of 64 (expand 2), one group of
state 128, a 4-tap convolution, on the same layers (Granite 4.0-H itself has attention on about
one layer in ten). ``bytes_per_sequence``: the slot's
keys and values at the prompt's length plus, in the hybrid, its fixed DeltaNet states.
``bound``: decode reads every weight and every cached byte each step, so the hybrid's speedup
over all-attention is at most the ratio of bytes read per step (weights + the running
sequences' caches) where memory bound; the measured ratio sits under it (the delta rule's
state update is compute, not bytes). Progress goes to stderr; one JSON object is the last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch

from pivotflow.engines.base import GenerationRequest, SamplingParams
from pivotflow.engines.torch import TorchEngine
from pivotflow.engines.torch.model import Decoder
from pivotflow.engines.torch.model_config import ModelConfig

BATCHES = (1, 8)
VOCAB = 2000
SHAPE: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
    num_attention_heads=8, num_key_value_heads=2, head_dim=128, max_position_embeddings=4096,
    architecture="qwen3_5_text", attention_bias=False, tie_word_embeddings=False,
    partial_rotary_factor=0.25, rope_theta=1e7, linear_num_key_heads=8,
    linear_num_value_heads=8, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4)
HYBRID = (0, 1, 2, 4, 5, 6)
GRANITE: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
    num_attention_heads=8, num_key_value_heads=2, head_dim=128, max_position_embeddings=4096,
    architecture="granitemoehybrid", attention_bias=False, tie_word_embeddings=False,
    nope_layers=tuple(range(8)), mamba_n_heads=32, mamba_d_head=64, mamba_n_groups=1,
    mamba_d_state=128, mamba_d_conv=4)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def bytes_per_sequence(engine: TorchEngine, length: int) -> int:
    """What one slot holds at ``length`` positions: keys and values of the attention layers,
    and the linear layers' states."""
    cache = engine._cache
    assert cache is not None
    per_position = cache.kv[:, :, 0].numel() // cache.capacity * cache.kv.element_size()
    states = 0
    if cache.states is not None:
        conv, rec = cache.states.conv[:, 0], cache.states.recurrent[:, 0]
        states = conv.numel() * conv.element_size() + rec.numel() * rec.element_size()
    return per_position * length + states


def timed(engine: TorchEngine, prompts: list[list[int]], new: int,
          repeats: int) -> tuple[float, float]:
    """(prefill seconds, decode tokens/s), best of ``repeats``."""
    best_prefill = best_decode = float("inf")
    params = SamplingParams(temperature=0.0, max_tokens=new)
    for _ in range(repeats):
        for i, p in enumerate(prompts):
            engine.add_request(GenerationRequest(f"r{i}", p, params))
        t0 = time.perf_counter()
        engine.step()  # (the prefills and a first token)
        t1 = time.perf_counter()
        while engine.has_work():
            engine.step()
        best_prefill = min(best_prefill, t1 - t0)
        best_decode = min(best_decode, time.perf_counter() - t1)
    return best_prefill, len(prompts) * (new - 1) / best_decode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=("qwen3_5", "granite"), default="qwen3_5")
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    shape = GRANITE if args.family == "granite" else SHAPE
    out: dict[str, Any] = {"bench": "hybrid_attention", "prompt_len": args.prompt_len,
                           "new_tokens": args.new_tokens, "family": shape["architecture"]}
    for name, linear in (("hybrid", HYBRID), ("all_attention", ())):
        torch.manual_seed(0)
        cfg = ModelConfig(**shape, linear_attention_layers=linear)
        weights = {k: v.detach() for k, v in Decoder(cfg).state_dict().items()}
        params = sum(w.numel() for w in weights.values())
        got: dict[str, Any] = {"parameters": params, "prefill_s": {}, "tokens_per_s": {}}
        for batch in BATCHES:
            engine = TorchEngine(cfg, max_batch=batch,
                                 max_seq_len=args.prompt_len + args.new_tokens + 16)
            engine.load_weights(weights, 0)
            prompts = [torch.randint(3, VOCAB, (args.prompt_len,), generator=g).tolist()
                       for _ in range(batch)]
            prefill, rate = timed(engine, prompts, args.new_tokens, args.repeats)
            got["prefill_s"][str(batch)] = round(prefill, 3)
            got["tokens_per_s"][str(batch)] = round(rate, 1)
            got["bytes_per_sequence"] = bytes_per_sequence(engine, args.prompt_len)
            log(f"{name} batch {batch}: prefill {prefill:.2f} s, {rate:.1f} tokens/s, "
                f"{got['bytes_per_sequence'] / 2**20:.1f} MiB a sequence")
        out[name] = got
    hybrid, full = out["hybrid"], out["all_attention"]
    out["ratios"] = {
        "bytes_per_sequence": round(full["bytes_per_sequence"] / hybrid["bytes_per_sequence"], 2),
        **{f"decode_batch_{b}": round(hybrid["tokens_per_s"][str(b)]
                                      / full["tokens_per_s"][str(b)], 2) for b in BATCHES},
        **{f"prefill_batch_{b}": round(full["prefill_s"][str(b)]
                                       / hybrid["prefill_s"][str(b)], 2) for b in BATCHES}}
    # bytes read per decode step: every weight (float32) and each running sequence's cache
    out["bound"] = {f"decode_batch_{b}": round(
        (4 * full["parameters"] + b * full["bytes_per_sequence"])
        / (4 * hybrid["parameters"] + b * hybrid["bytes_per_sequence"]), 2) for b in BATCHES}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
