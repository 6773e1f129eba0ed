"""A LoRA run end to end (``--set graph.lora_rank=N``): real workers train adapters, every
checkpoint's policy folder is a plain Hugging Face model with them merged in, its ``adapter/``
folder is what PEFT loads onto the base model to the same weights, its optimizer state holds
the adapters and their AdamW moments, and a resumed run takes them up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from pivotflow import checkpoints
from pivotflow.metrics import read_metrics
from pivotflow.run import run

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
GENRM = ROOT / "graphs" / "grpo_genrm.py"


def test_a_lora_run_checkpoints_a_plain_policy_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    sets = ["live=false", "checkpoint_every=2", "graph.lora_rank=4", "graph.lr=3e-3"]
    run(GENRM, sets=sets, out=out, steps=2, console=False)
    latest = checkpoints.latest(out)
    assert latest is not None
    ckpt = checkpoints.read(latest)
    assert ckpt.step == 2 and ckpt.optimizer is not None
    kinds = {k.rsplit(".", 1)[-1] for k in ckpt.optimizer}
    assert kinds == {"lora_A", "lora_B", "exp_avg", "exp_avg_sq", "step"}
    assert all(".lora_" in k for k in ckpt.optimizer)  # no moments of a frozen weight
    assert any(ckpt.optimizer[k].abs().max() > 0 for k in ckpt.optimizer
               if k.endswith(".lora_B"))  # (B starts at 0: the steps moved it)
    names: set[str] = set()
    for f in ckpt.policy_dir.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            names |= set(st.keys())
    assert names and not any("lora" in n for n in names)  # merged: what any HF loader reads
    peft_merges_to_the_policy(ckpt.path)
    run(GENRM, sets=sets, out=out, steps=4, console=False, resume=str(out))
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl")]
    assert steps == [1, 2, 3, 4]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ledger"]["duplicates"] == 0
    # the resumed trainer took the adapters' AdamW state up: its step count went on to 4 (a
    # trainer that started them afresh would count 2)
    last = checkpoints.read(checkpoints.latest(out) or out)
    assert last.step == 4 and last.optimizer is not None
    assert {float(v) for k, v in last.optimizer.items() if k.endswith(".step")} == {4.0}


def peft_merges_to_the_policy(ckpt: Path) -> None:
    """PEFT loads the checkpoint's adapter onto the base model it names and merges it: the
    weights are the checkpoint's policy folder's (float32 rounding apart)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    config = json.loads((ckpt / "adapter" / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 16.0)
    base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"],
                                                dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(ckpt / "adapter")).merge_and_unload()
    ours = AutoModelForCausalLM.from_pretrained(ckpt / "policy", dtype=torch.float32)
    before = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"],
                                                  dtype=torch.float32).state_dict()
    theirs, mine = merged.state_dict(), ours.state_dict()
    assert theirs.keys() == mine.keys() == before.keys()
    for k, w in mine.items():
        torch.testing.assert_close(theirs[k], w, rtol=0, atol=1e-6, msg=k)
    # (the adapters changed the weights, so the comparison says something)
    assert any(not torch.equal(mine[k], before[k]) for k in mine)


def test_trainers_taking_over_each_step_keep_the_base(tmp_path: Path) -> None:
    """Rollout and trainer time-share one worker (colocated), so every step's trainer is built
    anew and takes the pool's state from the store: the policy less the adapters' update is its
    base. After the take-overs of four steps (three at least) the checkpoint is still the base
    plus the adapters (PEFT merges to it), which a base restored wrong (kept merged, or the
    update taken twice) fails."""
    out = tmp_path / "run"
    run(GENRM, sets=["live=false", "checkpoint_every=4", "graph.lora_rank=4", "graph.lr=3e-3",
                     "planner=static", "colocate=rollout+trainer"],
        out=out, workers=2, steps=4, console=False)
    shifts = [json.loads(x) for x in (out / "shifts.jsonl").read_text().splitlines()]
    assert sum(x["to"] == "trainer" for x in shifts) >= 3  # (the first trainer starts fresh)
    latest = checkpoints.latest(out)
    assert latest is not None and checkpoints.read(latest).step == 4
    peft_merges_to_the_policy(latest)


def test_a_kl_penalty_under_lora_needs_no_reference_pool(tmp_path: Path) -> None:
    """``graph.kl_coef`` with ``graph.lora_rank``: the graph adds no reference pool, and the
    trainer reports the KL to its base (zero at the first step, when the policy is the base)."""
    out = tmp_path / "run"
    result = run(GENRM, sets=["live=false", "graph.lora_rank=4", "graph.lr=3e-3",
                              "graph.kl_coef=0.1"], out=out, steps=3, console=False)
    steps = read_metrics(out / "metrics.jsonl")
    assert all(set(r["pools"]) == {"rollout", "genrm", "trainer"} for r in steps)
    kl = [r["train_kl_ref"] for r in steps]
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and kl[-1] > 0
    assert result.summary["ledger"]["duplicates"] == 0
