"""Qwen3-MoE on the embedded engine: decode throughput against transformers and against dense
models of the same *active* and the same *total* parameters, and how far a bf16 rollout drifts
from the trainer's forward pass, in routing and in logprobs (what rollout routing replay, R3,
arXiv:2510.11370, targets).

    python bench/moe.py [--new-tokens 64] [--repeats 3] [--threads 1] [--out FILE]

Models (random weights, random prompt ids): Qwen3-30B-A3B's proportions scaled to one CPU thread
-- hidden 256, 4 layers, 4 heads of 64 (1 KV head), q/k norms, 64 experts of 128 units with 4
per token (30B-A3B: 128 of 768, 8 per token). ``dense_active`` is the same Qwen3 with one MLP
of 4 x 128 units (the FLOPs a token spends in the experts), ``dense_total`` one of 64 x 128
(every expert's weights in one matrix). A decode step of the MoE reads the weights of the
experts its batch chose: at batch 1, 4 of 64 (near ``dense_active``'s bytes); at batch 64 nearly
all (``dense_total``'s bytes, in 64 smaller matmuls). So ``dense_active`` is the MoE's upper
bound and ``dense_total`` the reference it should pass once a batch covers the experts.

Mismatch: 16 prompts x 64 tokens sampled by the engine in bfloat16, then scored as the trainer
scores them (float32 master weights under bf16 autocast, as a bf16 run trains). Reported for
the MoE and for ``dense_active``: |rollout - trainer| logprob (mean, p99, max); for the MoE
also with the rollout's routing replayed in the trainer's forward (``routing_replay=True``:
the engine records each token's experts), and the share of (token, sparse layer) routing
decisions whose top-k set differs between the trainer's bf16-autocast forward and a float32
forward.

Then a real run (``--run-steps``, 0 to skip): ``examples/byo_model.py`` (GRPO on sums, real
processes) on a Qwen3-MoE of the same family (hidden 128, 2 layers, 32 experts, 4 a token) with
the example's BPE tokenizer, in bf16, ``max_staleness=0``, once with ``graph.routing_replay``
off and once on: the trainer's ``train_rollout_logprob_gap`` per step, and its mean.

Progress goes to stderr; one JSON object is the last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine as engine_bench  # noqa: E402 - a sibling file, not a package

from pivotflow.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from pivotflow.engines.torch import TorchEngine, load_checkpoint  # noqa: E402
from pivotflow.engines.torch.feedforward import (  # noqa: E402
    SparseMoE,
    route,
    router_logits,
    routing_from_bytes,
)
from pivotflow.engines.torch.model import Decoder  # noqa: E402

VOCAB, PROMPT_LEN = 1000, 32
SHAPE: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=1, head_dim=64, max_position_embeddings=512, tie_word_embeddings=False,
)  # fmt: skip
EXPERTS, PER_TOKEN, EXPERT_UNITS = 64, 4, 128


def save_models(root: Path) -> dict[str, Path]:
    """The three models, saved by transformers (weights wider than its init, so routing and
    sampling are not near-uniform)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    built = {
        "moe": Qwen3MoeForCausalLM(Qwen3MoeConfig(
            **SHAPE, intermediate_size=PER_TOKEN * EXPERT_UNITS, num_experts=EXPERTS,
            num_experts_per_tok=PER_TOKEN, moe_intermediate_size=EXPERT_UNITS,
            norm_topk_prob=True)),  # fmt: skip
        "dense_active": Qwen3ForCausalLM(
            Qwen3Config(**SHAPE, intermediate_size=PER_TOKEN * EXPERT_UNITS)),
        "dense_total": Qwen3ForCausalLM(
            Qwen3Config(**SHAPE, intermediate_size=EXPERTS * EXPERT_UNITS)),
    }
    out = {}
    for name, model in built.items():
        torch.manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.06)
        out[name] = root / name
        model.save_pretrained(out[name])
    return out


def prompts(batch: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, PROMPT_LEN), generator=g).tolist()


def parameters(folder: Path) -> dict[str, int]:
    cfg, tensors = load_checkpoint(folder)
    total = sum(t.numel() for t in tensors.values())
    inactive = 0
    if cfg.num_experts:
        per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
        sparse = sum(cfg.is_sparse(i) for i in range(cfg.num_hidden_layers))
        inactive = sparse * (cfg.num_experts - cfg.num_experts_per_tok) * per_expert
    return {"total": total, "active": total - inactive}


def route_recorder(model: Decoder) -> tuple[list[torch.Tensor], Callable[[], None]]:
    """Top-k expert ids [tokens, k] of each sparse layer's router (its own choice, sorted),
    appended per forward."""
    seen: list[torch.Tensor] = []

    def hook(block: SparseMoE, inputs: tuple[torch.Tensor, ...], _out: Any) -> None:
        x = inputs[0].reshape(-1, inputs[0].shape[-1])  # (under the block's own autocast)
        logits = router_logits(block.gate, x, block.routing)
        seen.append(route(logits, block.routing, block.correction_bias)[1].sort(-1).values)

    hooks = [layer.mlp.register_forward_hook(hook)
             for layer in model.model.layers if isinstance(layer.mlp, SparseMoE)]
    return seen, lambda: [h.remove() for h in hooks]  # type: ignore[func-returns-value]


def mismatch(folder: Path, new: int) -> dict[str, Any]:
    """A bf16 engine's sampled tokens, scored by the trainer's forward (fp32 weights, bf16
    autocast) and by a plain fp32 forward."""
    cfg, tensors = load_checkpoint(folder)
    moe = bool(cfg.sparse_layers)
    engine = TorchEngine(cfg, max_batch=16, max_seq_len=PROMPT_LEN + new, dtype="bf16",
                         record_routing=moe)  # fmt: skip
    engine.load_weights(tensors, 0)
    batch = prompts(16, seed=1)
    outs = engine.generate([
        GenerationRequest(f"m{i}", p, SamplingParams(temperature=1.0, max_tokens=new, seed=i))
        for i, p in enumerate(batch)])  # fmt: skip
    trainer = Decoder(cfg)
    trainer.load_state_dict(tensors, strict=False)
    trainer.eval()
    ids = torch.tensor([p + o.token_ids for p, o in zip(batch, outs, strict=True)])
    rollout = torch.tensor([o.logprobs for o in outs])
    routing = None
    if moe:  # the rollout's own expert choices, replayed (the last token's: the trainer's own)
        routing = torch.full((*ids.shape, cfg.sparse_layers, cfg.num_experts_per_tok), -1)
        for i, o in enumerate(outs):
            recorded = routing_from_bytes(o.routing, cfg)
            routing[i, : recorded.shape[0]] = recorded
    seen, done = route_recorder(trainer)
    scored = {}
    with torch.no_grad():
        for name, autocast, replay in (("autocast_bf16", True, None), ("fp32", False, None),
                                       ("autocast_bf16_replayed", True, routing)):  # fmt: skip
            if name.endswith("replayed") and replay is None:
                continue
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = trainer(ids, routing=replay)[:, PROMPT_LEN - 1:-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, ids[:, PROMPT_LEN:, None])[..., 0]
            scored[name] = logp
            if name == "fp32":
                done()  # the routing of the first two forwards only
    out: dict[str, Any] = {}
    for name, logp in scored.items():
        diff = (rollout - logp).abs().flatten()
        out[f"vs_trainer_{name}"] = {"mean": round(float(diff.mean()), 4),
                                     "p99": round(float(diff.quantile(0.99)), 4),
                                     "max": round(float(diff.max()), 4)}  # fmt: skip
    if seen:  # the autocast forward's layers, then the fp32 forward's
        half = len(seen) // 2
        flips = [(a != b).any(-1) for a, b in zip(seen[:half], seen[half:], strict=True)]
        out["routing_differs_bf16_vs_fp32"] = round(float(torch.cat(flips).float().mean()), 4)
    return out


def run_gap(root: Path, steps: int) -> dict[str, Any]:
    """``train_rollout_logprob_gap`` of a bf16 run of examples/byo_model.py on a small
    Qwen3-MoE, routing replay off and on (same seed, same prompts)."""
    from transformers import GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from pivotflow.graph_check import import_graph_file
    from pivotflow.metrics import read_metrics
    from pivotflow.run import run

    example = Path(__file__).resolve().parents[1] / "examples" / "byo_model.py"
    byo = import_graph_file(example)  # its folder and prompt writers
    folder = byo.build_tiny_folder(root / "model")  # its tokenizer; the weights replaced
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=vocab, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
        num_experts=32, num_experts_per_tok=4, norm_topk_prob=True, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
        eos_token_id=0, pad_token_id=0))  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    model.generation_config = GenerationConfig(eos_token_id=[2, 0], pad_token_id=0)
    (folder / "model.safetensors").unlink()
    model.save_pretrained(folder)
    prompts = byo.write_prompts(root / "prompts.jsonl")
    out: dict[str, Any] = {"steps": steps}
    for replay in (False, True):
        name = "replay_on" if replay else "replay_off"
        engine_bench.log(f"[moe] run, routing replay {'on' if replay else 'off'}, {steps} steps")
        result = run(example, steps=steps, out=root / name, console=False,
                     sets=["live=false", "dtype=bfloat16", "max_staleness=0",
                           f"graph.model={folder}", f"graph.prompts={prompts}",
                           f"graph.routing_replay={json.dumps(replay)}"])  # fmt: skip
        gaps = [r["train_rollout_logprob_gap"] for r in read_metrics(result.out / "metrics.jsonl")
                if "train_rollout_logprob_gap" in r]
        out[name] = {"per_step": [round(g, 5) for g in gaps],
                     "mean": round(sum(gaps) / max(len(gaps), 1), 5)}  # fmt: skip
    out["on_over_off"] = round(out["replay_on"]["mean"] / out["replay_off"]["mean"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--run-steps", type=int, default=6, help="the real runs (0: skip)")
    parser.add_argument("--out", help="also write the JSON object to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    new, started = args.new_tokens, time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folders = save_models(Path(tmp))
        runners = {}
        for name, folder in folders.items():
            cfg, tensors = load_checkpoint(folder)
            runners[name] = engine_bench.engine_runner(cfg, tensors, new, PROMPT_LEN + new)
        runners["moe_transformers"] = engine_bench.hf_runner(folders["moe"], new)
        engine_bench.log("[moe] greedy agreement, engine vs transformers, batch 8")
        agree = engine_bench._agreement(runners["moe"](prompts(8)),
                                        runners["moe_transformers"](prompts(8)))  # fmt: skip
        rates = engine_bench.throughput(runners, prompts, new, args.repeats, "moe")
        sizes = {name: parameters(folder) for name, folder in folders.items()}
        engine_bench.log("[moe] rollout vs trainer mismatch, bf16")
        drift = {name: mismatch(folders[name], new) for name in ("moe", "dense_active")}
        run = run_gap(Path(tmp) / "runs", args.run_steps) if args.run_steps else None
    moe = rates["moe"]
    result = {
        "bench": "moe",
        "shape": {**SHAPE, "num_experts": EXPERTS, "num_experts_per_tok": PER_TOKEN,
                  "moe_intermediate_size": EXPERT_UNITS},  # fmt: skip
        "parameters": sizes,
        "new_tokens": new,
        "threads": args.threads,
        "tokens_per_s": {name: engine_bench._rounded(r) for name, r in rates.items()},
        "moe_over_dense_active": engine_bench._ratios(moe, rates["dense_active"]),
        "moe_over_dense_total": engine_bench._ratios(moe, rates["dense_total"]),
        "moe_over_transformers": engine_bench._ratios(moe, rates["moe_transformers"]),
        "greedy_agreement_vs_transformers": agree,
        "bf16_rollout_mismatch": drift,
        "run_rollout_logprob_gap": run,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    line = json.dumps(result)
    if args.out:
        Path(args.out).write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
