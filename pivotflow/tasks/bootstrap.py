"""The tiny models of the embedded default, trained by the project itself from a seed.

* the **policy** (Qwen2-shaped, ~0.8M parameters) is a *sloppy student* of 2-digit addition:
  its fine-tuning labels are right 40% of the time and near misses otherwise (the slips of
  ``judge_format.near_miss``: off by one, swapped or dropped digits ...). It trains until its
  *sampled* accuracy (temperature 1, what RL rollouts see) enters [0.35, 0.55] while its greedy
  answer is right on 95% of held-out sums: the answer is its mode, but it often slips. That
  is the regime RL post-training works in (pass@k far above pass@1): GRPO sharpens the
  distribution, and the gain generalises across prompts because the slips are the same kind
  everywhere. (A policy merely stopped early on right labels is sharp where it is wrong; GRPO
  moved it by ~0.05 in 600 steps.);
* the **judge** (GenRM, ~0.25M parameters) reads ``"47+38=84?"`` and generates ``"85:No"``:
  the sum it computes, then its verdict. It trains until its greedy verdicts are right on at
  least 97% of held-out pairs (half right answers, near misses like 47+38=84, some garbage) and
  93% of the near misses alone.

Both share one tokenizer, a small byte-level BPE trained first on the kit's text (``bpe.py``),
and every model folder is an ordinary Hugging Face one: config.json, model.safetensors,
generation_config.json and the tokenizer's files, loadable by ``AutoModelForCausalLM`` and
``AutoTokenizer``. Heads are 32 wide in both models (vLLM's CPU backend needs head_dim >= 32).
Prompts are raw text (no chat template). The two train at once in two processes (one core
each). ``python -m pivotflow.tasks.bootstrap [--seed N] [--quick] [--out DIR]`` rebuilds them
and prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pivotflow.engines.base import GenerationRequest, SamplingParams
from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.engines.torch.weights import save_checkpoint
from pivotflow.errors import PivotflowError
from pivotflow.tasks.judge_format import judge_examples, near_miss, parse_verdict
from pivotflow.tasks.registry import get_task, make_dataset, split_dataset
from pivotflow.tasks.sft import (
    SFTConfig,
    greedy_complete,
    prompt_ids,
    teacher_forced_accuracy,
    train_sft,
)
from pivotflow.tokenizer import load_tokenizer
from pivotflow.tokenizer.base import Tokenizer

POLICY_RIGHT_LABELS = 0.4  # the share of right answers in the policy's fine-tuning labels
POLICY_LABELS_PER_SUM = 8  # labels drawn per training sum, so it learns the slip distribution
POLICY_BAND = (0.35, 0.55)  # sampled accuracy at temperature 1
# ... reached by a policy whose greedy answer is right: RL then sharpens a distribution that
# holds the answer (measured offline, GRPO with the exact reward, 64 samples a step, lr 1e-5:
# 0.42 -> 0.74 held-out sampled accuracy in 300 steps).
POLICY_MIN_GREEDY = 0.95
JUDGE_TARGET = 0.97  # held-out verdict accuracy
NEAR_MISS_TARGET = 0.93  # ... and on the near misses alone (what a policy's wrong answers are)
# Looser targets and fewer steps for tests (``quick``): the build and the cache are what a
# quick build tests, and that it trained at all. An untrained policy samples 0-0.007 right;
# 0.02 takes ~120 steps (seed 0), where 0.05 took 620 of the 750 allowed (75 s of a test's
# 90, and near the cap). An untrained judge says No to all (0.51); 0.60 takes ~370 steps.
QUICK_POLICY_BAND = (0.02, 0.95)
QUICK_JUDGE_TARGET = 0.60
QUICK_STEPS_SCALE = 0.25


def policy_config(vocab: int) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, hidden_size=128, intermediate_size=384,
                       num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64)


def judge_config(vocab: int) -> ModelConfig:
    # Two heads of 32 (v2 had four of 16, which vLLM's CPU backend cannot run).
    return ModelConfig(vocab_size=vocab, hidden_size=64, intermediate_size=192,
                       num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2,
                       max_position_embeddings=64)


def sampled_accuracy(model: Decoder, tok: Tokenizer, problems: list[Any], seed: int) -> float:
    """Exact-match accuracy of temperature-1 samples from the embedded engine."""
    from pivotflow.engines.torch.engine import TorchEngine

    task = get_task("arithmetic")
    engine = TorchEngine(model.config, max_batch=64, eos_token_id=tok.eos_id)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    engine.load_weights(state, 0)
    reqs = [GenerationRequest(str(i), prompt_ids(tok, p.prompt),
                              SamplingParams(temperature=1.0, max_tokens=6, seed=seed + i,
                                             stop_token_ids=tok.eos_ids))
            for i, p in enumerate(problems)]
    outs = {o.request_id: o for o in engine.generate(reqs)}
    hits = sum(task.check(p, tok.decode(outs[str(i)].token_ids)) for i, p in enumerate(problems))
    return hits / len(problems)


def train_policy(seed: int, quick: bool, report: Callable[[dict], None],
                 tok: Tokenizer) -> tuple[Decoder, dict]:
    torch.manual_seed(seed)
    task = get_task("arithmetic")
    train, held = split_dataset(make_dataset(task, 8100, seed), 500, seed)
    rng = random.Random(seed)
    pairs = [(p.prompt, p.answer if rng.random() < POLICY_RIGHT_LABELS
              else near_miss(p.answer, rng))
             for p in train for _ in range(POLICY_LABELS_PER_SUM)]
    model = Decoder(policy_config(tok.vocab_size))
    lo, hi = QUICK_POLICY_BAND if quick else POLICY_BAND
    scale = QUICK_STEPS_SCALE if quick else 1.0
    found: dict[str, Any] = {}

    held_pairs = [(p.prompt, p.answer) for p in held[:300]]
    min_greedy = 0.0 if quick else POLICY_MIN_GREEDY

    def stop(step: int) -> bool:
        acc = sampled_accuracy(model, tok, held[:300], seed)
        greedy = teacher_forced_accuracy(model, tok, held_pairs)
        report({"model": "policy", "step": step, "sampled_accuracy": acc, "greedy": greedy})
        if lo <= acc <= hi and greedy >= min_greedy:
            found.update(step=step, sampled_accuracy=acc, greedy_accuracy=greedy)
            return True
        return False

    cfg = SFTConfig(steps=int(3000 * scale), batch_size=128, lr=1e-3, warmup_steps=50,
                    schedule="cosine", threads=1, seed=seed, eval_every=int(250 * scale))
    res = train_sft(model, tok, pairs, cfg, should_stop=stop, progress=False)
    if not found:
        raise PivotflowError(f"policy bootstrap never reached sampled accuracy in [{lo}, {hi}] "
                             f"with greedy accuracy >= {min_greedy} (seed {seed})")
    return model, {**found, "steps": res.steps, "train_s": res.seconds,
                   "params": sum(p.numel() for p in model.parameters())}


def train_judge(seed: int, quick: bool, report: Callable[[dict], None],
                tok: Tokenizer) -> tuple[Decoder, dict]:
    torch.manual_seed(seed + 1)
    task = get_task("arithmetic")
    train, held = split_dataset(make_dataset(task, 8100, seed + 1), 500, seed + 1)
    # Hard negatives weigh more than in the held-out mix: a judge that says Yes to 47+38=84
    # rewards exactly the mistakes RL should remove.
    examples = judge_examples(train, seed + 1, per_problem=8, correct_fraction=0.4,
                              garbage_fraction=0.05)
    held_ex = judge_examples(held, seed + 2, per_problem=1)
    # Plain addition pairs too: the judge's chain of thought is the sum.
    pairs = [(e.prompt, e.target) for e in examples] + [(p.prompt, p.answer) for p in train]
    model = Decoder(judge_config(tok.vocab_size))
    target = QUICK_JUDGE_TARGET if quick else JUDGE_TARGET
    scale = QUICK_STEPS_SCALE if quick else 1.0
    found: dict[str, Any] = {}

    def verdict_accuracy() -> tuple[float, float]:
        outs = greedy_complete(model, tok, [e.prompt for e in held_ex], 8)
        right = [parse_verdict(o) == float(e.correct) for o, e in zip(outs, held_ex, strict=True)]
        near = [r for r, e in zip(right, held_ex, strict=True) if e.kind == "near_miss"]
        return sum(right) / len(right), sum(near) / max(1, len(near))

    def stop(step: int) -> bool:
        acc, near = verdict_accuracy()
        report({"model": "judge", "step": step, "verdict_accuracy": acc, "near_miss": near})
        if acc >= target and (quick or near >= NEAR_MISS_TARGET):
            found.update(verdict_accuracy=acc, near_miss_accuracy=near)
            return True
        return False

    cfg = SFTConfig(steps=int(9000 * scale), batch_size=128, lr=3e-3, warmup_steps=200,
                    schedule="cosine", threads=1, seed=seed, eval_every=int(250 * scale))
    res = train_sft(model, tok, pairs, cfg, should_stop=stop, progress=False)
    if not found:
        acc, near = verdict_accuracy()
        raise PivotflowError(f"judge bootstrap reached verdict accuracy {acc:.3f} (near misses "
                             f"{near:.3f}), below {target} (seed {seed})")
    return model, {**found, "held_out_pairs": len(held_ex), "steps": res.steps,
                   "train_s": res.seconds, "params": sum(p.numel() for p in model.parameters())}


def save_model(model: Decoder, tok: Tokenizer, out: Path, meta: dict) -> None:
    """An HF model folder at ``out``: config.json and model.safetensors, generation_config.json
    (its eos ids are the stop tokens), the tokenizer's files, and meta.json (the figures)."""
    generation = {"eos_token_id": tok.eos_id if len(tok.eos_ids) == 1 else list(tok.eos_ids),
                  "pad_token_id": tok.pad_id}
    if tok.bos_id is not None:
        generation["bos_token_id"] = tok.bos_id
    save_checkpoint(out, model.config, model.state_dict(), generation_config=generation)
    tok.save(out)
    (out / "meta.json").write_text(json.dumps(meta, indent=2))


def _child(which: str, seed: int, quick: bool, out: str, q: Any) -> None:
    try:
        train = train_policy if which == "policy" else train_judge
        tok = load_tokenizer(out)  # the parent trained it and saved it there
        model, meta = train(seed, quick, q.put, tok)
        save_model(model, tok, Path(out), {**meta, "seed": seed, "quick": quick})
        q.put({"model": which, "done": meta})
    except BaseException as exc:  # reported to the parent, which raises it
        q.put({"model": which, "error": f"{type(exc).__name__}: {exc}"})


def bootstrap(out: Path, seed: int = 0, *, quick: bool = False, progress: bool = True) -> dict:
    """Train the tokenizer, then policy and judge into ``out/policy`` and ``out/judge`` (in
    parallel processes); returns their figures. Raises PivotflowError when a model misses its
    target."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from pivotflow.tasks.bpe import build_tokenizer

    t_tok = time.perf_counter()
    tok = build_tokenizer(seed)
    for which in ("policy", "judge"):
        (out / which).mkdir(parents=True, exist_ok=True)
        tok.save(out / which)
    tokenizer_s = time.perf_counter() - t_tok
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = {w: ctx.Process(target=_child, args=(w, seed, quick, str(out / w), q), daemon=True)
             for w in ("policy", "judge")}
    for p in procs.values():
        p.start()
    results: dict[str, Any] = {}
    t0 = time.perf_counter()
    columns = (TextColumn("bootstrap {task.description:7s}"), BarColumn(),
               TextColumn("{task.fields[status]}"), TimeElapsedColumn())
    with Progress(*columns, disable=not progress) as bar:
        tasks = {w: bar.add_task(w, total=None, status="training") for w in procs}
        try:
            while len(results) < 2:
                try:
                    msg = q.get(timeout=1.0)
                except queue.Empty:
                    dead = [w for w, p in procs.items() if not p.is_alive() and w not in results]
                    if dead:
                        raise PivotflowError(f"bootstrap of {dead[0]} died (exit code "
                                             f"{procs[dead[0]].exitcode})") from None
                    continue
                w = msg["model"]
                if "error" in msg:
                    raise PivotflowError(f"bootstrap of {w}: {msg['error']}")
                if "done" in msg:
                    results[w] = msg["done"]
                    bar.update(tasks[w], status="done", total=1, completed=1)
                else:
                    figs = {k: v for k, v in msg.items() if k not in ("model",)}
                    bar.update(tasks[w], status=" ".join(
                        f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in figs.items()))
        finally:
            for p in procs.values():
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
    return {**results, "tokenizer": {"vocab_size": tok.vocab_size, "train_s": tokenizer_s},
            "wall_s": time.perf_counter() - t0, "seed": seed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pivotflow.tasks.bootstrap")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="default: the model cache")
    args = ap.parse_args(argv)
    if args.out is None:
        from pivotflow.tasks.cache import rebuild

        figures = rebuild(args.seed, quick=args.quick)
    else:
        figures = bootstrap(args.out, args.seed, quick=args.quick)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

