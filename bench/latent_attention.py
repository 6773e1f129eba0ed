"""DeepSeek's latent attention on the embedded engine: KV cache bytes per token and decode
throughput at long contexts, for the tree on ``sys.path`` (time two trees in one sitting:
``PYTHONPATH=<tree> python bench/latent_attention.py``).

    python bench/latent_attention.py [--prompt-len 512] [--new-tokens 32] [--repeats 2]

Model (random weights, random prompt ids): Moonlight-16B-A3B's attention (16 heads, latent
512, no query latent, heads of 128 + 64 rotary, values 128) on a hidden size of 1024, 4 layers
with dense MLPs (experts left out: this measures the attention and its cache), float32, one
thread. ``cache_bytes_per_token``: what every running sequence's slot holds per position
(all layers); ``tokens_per_s``: decode throughput at each batch after prompts of
``--prompt-len`` tokens (best of ``--repeats``). The engine is the first of its kind to hold
latents only where it caches them: the ratio of its bytes to the expanded cache's is the
latent's 576 (times 2: keys and values) over 16 heads x 192 x 2.

Progress goes to stderr; one JSON object is the last line.
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

BATCHES = (1, 8, 32)
VOCAB = 2000
SHAPE: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
    num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048,
    architecture="deepseek_v3", attention_bias=False, tie_word_embeddings=False,
    q_lora_rank=0, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
    v_head_dim=128, head_dim=192, rope_interleave=True, rms_norm_eps=1e-6)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cache_bytes_per_token(engine: TorchEngine) -> int:
    """Bytes a slot holds per position, over every layer (keys and values)."""
    cache = engine._cache
    assert cache is not None
    per_slot = cache.kv[:, :, 0].numel() // cache.capacity  # (layers, k|v, heads, positions, D)
    return per_slot * cache.kv.element_size()


def decode_rate(engine: TorchEngine, prompts: list[list[int]], new: int, repeats: int) -> float:
    best = float("inf")
    params = SamplingParams(temperature=0.0, max_tokens=new)
    for _ in range(repeats):
        for i, p in enumerate(prompts):
            engine.add_request(GenerationRequest(f"r{i}", p, params))
        engine.step()  # (the prefills and a first token: not timed)
        t0 = time.perf_counter()
        while engine.has_work():
            engine.step()
        best = min(best, time.perf_counter() - t0)
    return len(prompts) * (new - 1) / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = ModelConfig(**SHAPE)
    weights = {k: v.detach() for k, v in Decoder(cfg).state_dict().items()}
    g = torch.Generator().manual_seed(1)
    out: dict[str, Any] = {"prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                           "tokens_per_s": {}}
    for batch in BATCHES:
        engine = TorchEngine(cfg, max_batch=batch,
                             max_seq_len=args.prompt_len + args.new_tokens + 16)
        engine.load_weights(weights, 0)
        prompts = [torch.randint(3, VOCAB, (args.prompt_len,), generator=g).tolist()
                   for _ in range(batch)]
        rate = decode_rate(engine, prompts, args.new_tokens, args.repeats)
        out["tokens_per_s"][str(batch)] = round(rate, 1)
        out["cache_bytes_per_token"] = cache_bytes_per_token(engine)
        log(f"batch {batch}: {rate:.1f} tokens/s, cache {out['cache_bytes_per_token']} B/token")
    expanded = 2 * 16 * 192 * 4 * SHAPE["num_hidden_layers"]  # (keys, padded values; fp32)
    out["expanded_cache_bytes_per_token"] = expanded
    print(json.dumps(out))


if __name__ == "__main__":
    main()
