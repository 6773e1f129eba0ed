"""PPO with a learned critic end to end (``graphs/ppo_genrm.py``): real workers score each
response with the critic of its step, GAE turns rewards and values into per-token advantages,
the trainer steps the policy and the critic, every checkpoint holds the critic as a Hugging
Face classifier folder with its optimizer state, and a resumed run takes both up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_records_doc import assert_documented

from pivotflow import checkpoints
from pivotflow.metrics import read_metrics
from pivotflow.run import run

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
PPO = ROOT / "graphs" / "ppo_genrm.py"
SETS = ["live=false", "checkpoint_every=2", "graph.groups_per_step=16",
        "graph.critic_lr=1e-3", "log_samples=4"]


def test_a_ppo_run_trains_its_critic_checkpoints_it_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run(PPO, sets=SETS, out=out, steps=2, console=False)
    first = read_metrics(out / "metrics.jsonl")
    for r in first:  # the critic's figures are in every step's record
        for key in ("train_value_loss", "train_value_clip_frac", "train_value_mean",
                    "train_return_mean", "train_value_error", "train_critic_grad_norm",
                    "train_value_explained_var"):
            assert key in r, key
    assert_documented({k for r in first for k in r}, "metrics.jsonl of a PPO run")
    lines = read_metrics(out / "samples.jsonl")
    assert_documented({k for r in lines for k in r}, "samples.jsonl of a PPO run")
    for line in lines:  # what a person debugging a critic reads: one value per token
        n = line["response_tokens"]
        assert len(line["values"]) == len(line["returns"]) == len(line["advantage"]) == n
    # step 0's critic is the zero head: its values are all 0, so with gamma = lam = 1 each
    # token's return is its response's reward (0 or 1), and the loss is half of its square
    r0 = first[0]
    assert r0["train_value_mean"] == 0.0 and 0 < r0["train_return_mean"] < 1
    assert r0["train_value_error"] == pytest.approx(r0["train_return_mean"], abs=1e-6)
    assert r0["train_value_loss"] == pytest.approx(0.5 * r0["train_return_mean"], abs=1e-6)
    # step 1 was scored by the critic step 0 published, which moved off zero
    assert first[1]["train_value_mean"] != 0.0
    ckpt = checkpoints.read(checkpoints.latest(out) or out)
    assert ckpt.step == 2 and ckpt.critic_dir is not None and ckpt.critic_optimizer is not None
    assert {float(v) for k, v in ckpt.critic_optimizer.items() if k.endswith(".step")} == {2.0}
    transformers_reads_the_critic(ckpt.critic_dir)
    run(PPO, sets=SETS, out=out, steps=4, console=False, resume=str(out))
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl")]
    assert steps == [1, 2, 3, 4]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ledger"]["duplicates"] == 0
    # the resumed trainer took the critic's AdamW state up: its step count went on to 4
    last = checkpoints.read(checkpoints.latest(out) or out)
    assert last.step == 4 and last.critic_optimizer is not None
    assert {float(v) for k, v in last.critic_optimizer.items() if k.endswith(".step")} == {4.0}


def transformers_reads_the_critic(folder: Path) -> None:
    """The checkpoint's critic loads as transformers' sequence classifier, every weight
    accounted for, and its score head over the last hidden states is our critic's value."""
    from transformers import AutoModelForSequenceClassification

    from pivotflow.engines.torch.weights import build_model, load_model_folder
    from pivotflow.protocol import TrainSeq
    from pivotflow.worker.reward_scoring import response_values
    from pivotflow.worker.train_role import pack

    theirs, info = AutoModelForSequenceClassification.from_pretrained(
        folder, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert theirs.config.num_labels == 1
    loaded = load_model_folder(folder)
    ours = build_model(loaded.config, loaded.tensors, torch.device("cpu"), torch.float32)
    seq = TrainSeq(job_id=0, prompt_ids=[5, 6, 7], response_ids=[8, 9, 10, 11],
                   logprobs=[0.0] * 4, versions=[], advantage=0.0)
    with torch.no_grad():
        mine = response_values(ours, pack([seq]))[0]
        hidden = theirs.model(torch.tensor([[5, 6, 7, 8, 9, 10, 11]])).last_hidden_state
        want = theirs.score(hidden)[0, 2:6, 0]  # the states before the 4 response tokens
    torch.testing.assert_close(mine, want, rtol=1e-5, atol=1e-5)
    assert mine.abs().max() > 0  # (the trained head moved: the comparison says something)


def test_workers_killed_under_ppo_lose_neither_samples_nor_the_critics_state(
        tmp_path: Path) -> None:
    """A worker SIGKILLed after every third step (chaos: a rollout, judge, critic or trainer
    worker), each replaced: a new trainer takes the critic and its AdamW state from the store
    and a new critic worker loads the newest critic, so the critic's optimizer ends at one
    step per version and no sample is lost or trained twice."""
    out = tmp_path / "run"
    sets = ["live=false", "graph.groups_per_step=16", "graph.critic_lr=1e-3",
            "chaos.kill_worker_every_steps=3"]
    result = run(PPO, sets=sets, out=out, steps=10, console=False)
    s = result.summary
    assert s["error"] is None and s["steps"] == 10 and s["chaos_kills"] >= 2
    assert s["worker_restarts"] >= s["chaos_kills"] - s["chaos_kills_unseen"]
    assert s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    last = checkpoints.read(checkpoints.latest(out) or out)
    assert last.step == 10 and last.critic_optimizer is not None
    assert {float(v) for k, v in last.critic_optimizer.items() if k.endswith(".step")} == {10.0}
