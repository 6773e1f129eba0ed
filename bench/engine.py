"""Decode throughput of the embedded TorchEngine vs transformers' generate, on one CPU thread.

Both run greedy decoding of the same random-weight tiny policy over a batch of equal-length
prompts for a fixed number of new tokens (no EOS), prefill included. Also times resuming a
request from half its tokens against generating it fresh. Prints one JSON object last.

    python bench/engine.py [--new-tokens 96] [--repeats 5] [--clock wall|cpu]

Runs alternate between the two so both see the same load on a shared host; each keeps its best.
``--clock cpu`` times with this thread's CPU time instead of the wall clock: both runners use one
thread, so it counts the same work while ignoring time the host gives to other processes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

from pivotflow.engines.base import GenerationRequest, SamplingParams
from pivotflow.engines.torch import (
    Decoder,
    ModelConfig,
    TorchEngine,
    load_checkpoint,
    save_checkpoint,
)

CONFIG = ModelConfig(
    vocab_size=99,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)
BATCHES = (1, 8, 32, 64)
PROMPT_LEN = 16
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = time.perf_counter


def _prompts(batch: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(batch)
    return torch.randint(3, CONFIG.vocab_size, (batch, PROMPT_LEN), generator=gen).tolist()


def _best(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return min(times)


def engine_runner(weights: dict[str, torch.Tensor], new: int):  # type: ignore[no-untyped-def]
    """A function running one greedy batch through TorchEngine."""
    engine = TorchEngine(CONFIG, max_batch=max(BATCHES))
    engine.load_weights(weights, 0)
    params = SamplingParams(temperature=0.0, max_tokens=new)

    def run(prompts: list[list[int]]) -> list[list[int]]:
        outs = engine.generate(
            [GenerationRequest(f"b{i}", p, params) for i, p in enumerate(prompts)]
        )
        if any(len(o.token_ids) != new for o in outs):
            raise RuntimeError("engine stopped early")
        return [o.token_ids for o in outs]

    return run


def hf_runner(model_dir: str, new: int):  # type: ignore[no-untyped-def]
    """The same through transformers' generate, or None when transformers is missing."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        return None
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0

    def run(prompts: list[list[int]]) -> list[list[int]]:
        ids = torch.tensor(prompts)
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=new,
                min_new_tokens=new,
            )
        if out.shape[1] != PROMPT_LEN + new:
            raise RuntimeError("transformers stopped early")
        return out[:, PROMPT_LEN:].tolist()

    return run


def throughput(runners: dict, new: int, repeats: int) -> dict[str, dict[str, float]]:  # type: ignore[type-arg]
    """tokens/s per runner and batch size. Runs alternate so both see the same machine load
    (this host is shared); each keeps its best time."""
    rates: dict[str, dict[str, float]] = {name: {} for name in runners}
    for batch in BATCHES:
        prompts = _prompts(batch)
        best = {name: float("inf") for name in runners}
        for _ in range(repeats):
            for name, run in runners.items():
                best[name] = min(
                    best[name], _best(lambda run=run, prompts=prompts: run(prompts), 1)
                )
        for name in runners:
            rates[name][str(batch)] = batch * new / best[name]
    return rates


def bench_resume(weights: dict[str, torch.Tensor], new: int, repeats: int) -> tuple[float, float]:
    """Seconds to finish one sampled request fresh vs resumed from half its tokens."""
    engine = TorchEngine(CONFIG, max_batch=1)
    engine.load_weights(weights, 0)
    params = SamplingParams(temperature=1.0, max_tokens=new, seed=7)
    prompt = _prompts(1)[0]
    full = engine.generate([GenerationRequest("fresh", prompt, params)])[0]
    half = new // 2
    resumed = GenerationRequest(
        "resumed", prompt, params, full.token_ids[:half], full.logprobs[:half], full.versions[:half]
    )
    if engine.generate([resumed])[0].token_ids != full.token_ids:
        raise RuntimeError("resumed request diverged from the fresh one")
    fresh_s = _best(lambda: engine.generate([GenerationRequest("f", prompt, params)]), repeats)
    resume_s = _best(lambda: engine.generate([resumed]), repeats)
    return resume_s, fresh_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    weights = Decoder(CONFIG).state_dict()
    with tempfile.TemporaryDirectory() as tmp:
        save_checkpoint(tmp, CONFIG, weights)
        _, weights = load_checkpoint(tmp)  # what transformers loads, bit for bit
        runners = {"ours": engine_runner(weights, args.new_tokens)}
        hf_run = hf_runner(tmp, args.new_tokens)
        if hf_run is not None:
            runners["hf"] = hf_run
        rates = throughput(runners, args.new_tokens, args.repeats)
        # Same weights, same greedy decoding: the tokens should agree (barring float near-ties).
        prompts = _prompts(8)
        agree = None if hf_run is None else runners["ours"](prompts) == hf_run(prompts)
    ours, hf = rates["ours"], rates.get("hf")
    resume_s, fresh_s = bench_resume(weights, args.new_tokens, args.repeats)
    result = {
        "bench": "engine",
        "threads": torch.get_num_threads(),
        "clock": args.clock,
        "new_tokens": args.new_tokens,
        "prompt_len": PROMPT_LEN,
        "tokens_per_s": {k: round(v, 1) for k, v in ours.items()},
        "hf_tokens_per_s": None if hf is None else {k: round(v, 1) for k, v in hf.items()},
        "ratio_vs_hf": None if hf is None else {k: round(ours[k] / hf[k], 2) for k in ours},
        "tokens_match_hf": agree,
        "resume_s": round(resume_s, 4),
        "fresh_s": round(fresh_s, 4),
    }
    for key in ("tokens_per_s", "hf_tokens_per_s", "ratio_vs_hf"):
        print(f"{key:>16}: {result[key]}")
    print(f"{'resume/fresh s':>16}: {resume_s:.4f} / {fresh_s:.4f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
