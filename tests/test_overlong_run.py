"""DAPO's overlong handling in a real run (graphs/grpo_rule.py on a random model, with
``overlong_penalty`` and ``mask_truncated`` stages before the advantage): each trained sample's
reward is its rule's reward less its length's share of the buffer, and each step trains exactly
the tokens of the responses that ended on a stop token."""

from __future__ import annotations

from pathlib import Path

import pytest

from pivotflow.metrics import read_metrics
from pivotflow.run import run

ROOT = Path(__file__).resolve().parents[1]
MAX_TOKENS = 6  # grpo_rule's cap; the buffer is all of it, so every token costs 1/6
pytestmark = pytest.mark.timeout(240)

STAGES = f"""
    from pivotflow.rl.group_fns import mask_truncated, overlong_penalty
    overlong = g.group("overlong", overlong_penalty({MAX_TOKENS}, {MAX_TOKENS}),
                       writes=["reward"])
    mask = g.group("mask", mask_truncated, writes=["loss_mask"])
    g.chain(prompts, rollout, reward, overlong, mask, advantage, train)
"""


def test_rewards_pay_for_length_and_truncated_responses_leave_the_loss(
        tmp_path: Path, random_models: dict[str, Path]) -> None:
    text = (ROOT / "graphs" / "grpo_rule.py").read_text()
    chain = "    g.chain(prompts, rollout, reward, advantage, train)\n"
    assert chain in text
    graph = tmp_path / "grpo_rule_overlong.py"
    graph.write_text(text.replace("builtin:policy", str(random_models["policy"]))
                     .replace(chain, STAGES.lstrip("\n")))
    out = tmp_path / "run"
    run(graph, sets=["live=false", "graph.groups_per_step=2", "graph.group_size=4",
                     "log_samples=-1"], out=out, steps=2, console=False)
    samples = read_metrics(out / "samples.jsonl")
    steps = read_metrics(out / "metrics.jsonl")
    assert len(samples) == 16 and {s["finish_reason"] for s in samples} == {"stop", "length"}
    for s in samples:  # the rule gives 0 or 1; the penalty is the response's length over 6
        rule = s["reward"] + min(1.0, s["response_tokens"] / MAX_TOKENS)
        assert min(abs(rule), abs(rule - 1.0)) < 1e-9
    for rec in steps:
        kept = sum(s["response_tokens"] for s in samples
                   if s["step"] == rec["step"] and s["finish_reason"] == "stop")
        assert rec["train_tokens"] == kept
        cut = [s for s in samples if s["step"] == rec["step"] and s["finish_reason"] == "length"]
        assert rec["response_clip_ratio"] == len(cut) / rec["samples"]
