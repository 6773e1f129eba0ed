"""Where did RL make the tool policy call the calculator? Before vs after an agentic run.

Held-out 2-digit sums are ranked by how well the *starting* policy answers them by itself (its
probability of writing the right answer and EOS straight after the prompt): the third it answers
worst is "needed", the third it answers best "least_needed". For the starting policy and the run's final
policy, the sampled (temperature 1) multi-turn rollout with the real calculator gives the share
of samples that call and the accuracy, per split. Prints one JSON object.

    python bench/agentic_tool_use.py [--run DIR]   (no --run: runs graphs/agentic_tools.py)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from pivotflow.engines.torch.model import Decoder
from pivotflow.engines.torch.weights import load_checkpoint
from pivotflow.tasks.registry import Problem, get_task
from pivotflow.tasks.sft import encode_pairs
from pivotflow.tasks.tool_policy import ensure_tool_policy
from pivotflow.tasks.tool_rollout import rollout_eval
from pivotflow.tokenizer import load_tokenizer
from pivotflow.tokenizer.base import Tokenizer

ROOT = Path(__file__).resolve().parents[1]


def load(path: Path) -> Decoder:
    config, tensors = load_checkpoint(path)
    model = Decoder(config)
    model.load_state_dict(tensors, strict=False)  # the tied head is not in the file
    return model.eval()


@torch.no_grad()
def direct_probability(model: Decoder, tok: Tokenizer, problems: list[Problem]) -> list[float]:
    """P(answer + EOS right after the prompt) under ``model``, per problem."""
    ids, mask = encode_pairs(tok, [(p.prompt, p.answer) for p in problems])
    logp = torch.log_softmax(model(ids[:, :-1]), -1).gather(-1, ids[:, 1:, None])[..., 0]
    return torch.exp((logp * mask).sum(1)).tolist()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", type=Path, default=None)
    ap.add_argument("--problems", type=int, default=600)
    args = ap.parse_args()
    torch.set_num_threads(2)
    t0 = time.perf_counter()
    run_dir = args.run
    if run_dir is None:
        from pivotflow.run import run

        run_dir = Path(tempfile.mkdtemp(prefix="pf-agentic-"))
        run(ROOT / "graphs" / "agentic_tools.py", sets=["live=false"], out=run_dir,
            console=False)
    start_dir = ensure_tool_policy(0, progress=False)
    start, end = load(start_dir), load(run_dir / "checkpoints" / "policy")
    tok = load_tokenizer(start_dir)  # the run trains the weights, never the tokenizer
    rng = random.Random(20261129)  # problems the run never trained on, most likely
    task = get_task("arithmetic")
    problems = [task.sample(rng) for _ in range(args.problems)]
    p_direct = direct_probability(start, tok, problems)
    ranked = [p for _, p in sorted(zip(p_direct, problems, strict=True), key=lambda x: x[0])]
    third = len(ranked) // 3
    splits = {"needed": ranked[:third], "least_needed": ranked[-third:]}
    out: dict[str, object] = {"bench": "agentic_tool_use", "run": str(run_dir)}
    for name, subset in splits.items():
        before = rollout_eval(start, tok, subset, seed=1)
        after = rollout_eval(end, tok, subset, seed=1)
        probs = sorted(p_direct)[:third] if name == "needed" else sorted(p_direct)[-third:]
        out[name] = {"problems": len(subset),
                     "p_direct_mean": round(sum(probs) / len(probs), 3),
                     "tool_rate_before": round(before["tool_rate"], 3),
                     "tool_rate_after": round(after["tool_rate"], 3),
                     "accuracy_before": round(before["accuracy"], 3),
                     "accuracy_after": round(after["accuracy"], 3)}
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    out["python"] = sys.version.split()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
