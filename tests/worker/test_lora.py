"""LoRA in the trainer (``lora_rank``): the adapted layer computes the merged weight's product;
the base weights never move; every published policy is the base plus the adapters' update, of
rank r; AdamW keeps state for the adapters alone; and a trainer that takes over the pool's state
from the store continues exactly as the one that left."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from msgspec.structs import replace as msgspec_replace
from test_train_memory import CFG, message, store_at
from torch import nn

from pivotflow.engines.torch.model import Decoder
from pivotflow.errors import CheckpointError, GraphError
from pivotflow.graph import Graph
from pivotflow.protocol import TrainStep
from pivotflow.worker.lora import LoRALinear, apply_lora, merged_state_dict
from pivotflow.worker.train_role import TrainRole

pytestmark = pytest.mark.timeout(120)

LORA = {"lr": 1e-2, "lora_rank": 4, "lora_alpha": 8.0}


def test_the_adapted_layer_is_the_merged_weights_product() -> None:
    torch.manual_seed(0)
    base = nn.Linear(12, 7)
    layer = LoRALinear(base, rank=3, alpha=6.0, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        layer.lora_B.normal_()  # (B starts at zero: give the update something to say)
    x = torch.randn(5, 12)
    merged = base.weight + 2.0 * layer.lora_B @ layer.lora_A
    torch.testing.assert_close(layer(x), F.linear(x, merged, base.bias))
    assert not layer.weight.requires_grad and not layer.bias.requires_grad
    assert layer.lora_A.requires_grad and layer.lora_B.requires_grad


def test_adapters_start_as_the_base_model_and_cover_the_targets() -> None:
    torch.manual_seed(0)
    model = Decoder(CFG)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert apply_lora(model, 4, 8.0, ["q_proj", "down_proj"]) == 2 * CFG.num_hidden_layers
    merged = merged_state_dict(model)
    assert merged.keys() == before.keys()  # Hugging Face names only
    for k, v in before.items():
        assert torch.equal(merged[k], v), k  # B = 0: the update is exactly nothing
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all(n.endswith((".lora_A", ".lora_B")) for n in trained)
    assert all(".q_proj." in n or ".down_proj." in n for n in trained)


def test_lora_steps_move_only_the_adapters(tmp_path: Path) -> None:
    """Two optimizer steps: each published version is the base plus an update of rank <= r in
    every adapted layer and the base itself elsewhere; AdamW's state is the adapters' alone."""
    store = store_at(tmp_path / "store")
    _, _, base = store.load("policy", 0)
    role = TrainRole(store, "policy", dict(LORA))
    for step in (0, 1):
        stats = role.train(message(step)).stats
        assert stats["grad_norm"] > 0
    _, _, published = store.load("policy", 2)
    # (the tied head is the embedding: not published, as without LoRA)
    assert published.keys() == base.keys() - {"lm_head.weight"}
    adapted = [k for k in published if k.endswith("_proj.weight")]
    assert len(adapted) == 7 * CFG.num_hidden_layers
    for k, new in published.items():
        w = base[k]
        diff = new - w
        if k in adapted:
            assert diff.abs().max() > 0, k
            assert torch.linalg.matrix_rank(diff.double(), atol=1e-6) <= 4, k
        else:  # norms and embeddings: frozen, not adapted
            assert torch.equal(new, w), k
    _, _, optim = store.load("policy.optim", 2)
    names = {k.rsplit(".", 1)[0] if k.endswith(("exp_avg", "exp_avg_sq", "step")) else k
             for k in optim}
    assert all(n.endswith((".lora_A", ".lora_B")) for n in names)
    full = sum(w.numel() for w in base.values())
    kept = sum(t.numel() for t in optim.values())
    assert kept < 0.5 * full  # the adapters and their moments, not two copies of the model


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_a_trainer_taking_over_continues_the_same_run(tmp_path: Path, zero_stage: int) -> None:
    """Trainer A takes steps 0 and 1, then leaves; trainer B, built from the store, takes over
    at version 2 (the adapters and their AdamW state from ``policy.optim``, or from rank 0's
    shard when sharded; its base as the policy less their update) and takes step 2 as A would
    have: the same published policy."""
    runs = []
    for takeover in (False, True):
        store = store_at(tmp_path / f"store-{takeover}")
        a = TrainRole(store, "policy", dict(LORA, zero_stage=zero_stage))
        a.train(message(0))
        a.train(message(1))
        if takeover:
            a.release()
            b = TrainRole(store, "policy", dict(LORA, zero_stage=zero_stage))
            m = message(2)
            b.train(TrainStep(step=2, seqs=m.seqs, rank=0, world=1, epoch=2, rendezvous="",
                              total_tokens=m.total_tokens, total_seqs=m.total_seqs,
                              optim_version=2))
        else:
            a.train(message(2))
        runs.append(store.load("policy", 3)[2])
        assert bool(store.versions("policy.optim.r0")) == bool(zero_stage)  # (its shard)
    stayed, took_over = runs
    for k, w in stayed.items():
        # (the base comes back from float32 merged weights: one rounding, then Adam's step)
        torch.testing.assert_close(took_over[k], w, rtol=1e-5, atol=1e-6, msg=k)


def test_adapters_of_another_rank_are_a_clear_error(tmp_path: Path) -> None:
    """A run resumed with another lora_rank finds adapters it cannot take: one line naming the
    state and the adapter, not a shape error from deep in torch."""
    store = store_at(tmp_path / "store")
    TrainRole(store, "policy", dict(LORA)).train(message(0))
    other = TrainRole(store, "policy", {**LORA, "lora_rank": 2})
    with pytest.raises(CheckpointError, match=r"^optimizer state policy\.optim@v1 has no LoRA "
                                              r"adapter 'model\.layers\.0\..*lora_rank 2\)"):
        other.load_from_store(1)


@pytest.mark.parametrize(("options", "message"), [
    ({"lora_rank": -1}, r"lora_rank must be >= 0 \(0: no LoRA\), got -1"),
    ({"lora_rank": 8, "lora_alpha": 0}, r"lora_alpha must be > 0, got 0"),
    ({"lora_rank": 8, "lora_target_modules": ["lm_head"]},
     r"lora_target_modules must name some of \['q_proj', .*got \['lm_head'\]"),
    ({"lora_rank": 8, "train_dtype": "bfloat16"}, r"lora_rank needs train_dtype float32"),
])
def test_bad_lora_settings_are_one_line_errors_at_the_graph(options: dict, message: str) -> None:
    g = Graph("lora")
    g.model("policy", source="builtin:policy")
    g.pool("trainer", workers=1)
    with pytest.raises(GraphError, match=message) as err:
        g.train("train", model="policy", pool="trainer", **options)
    assert "\n" not in str(err.value)


def test_under_lora_the_base_is_the_reference(tmp_path: Path) -> None:
    """A KL penalty under LoRA with no reference logprobs on the samples: the trainer scores
    each batch with its adapters left out, which is the frozen base, the run's initial policy.
    The same two steps given those logprobs by the base model itself (what a reference stage
    computes) take the same steps and report the same KL."""
    from pivotflow.worker.response_scoring import response_logprobs
    from pivotflow.worker.train_role import pack

    options = {**LORA, "kl_coef": 0.5}
    runs = []
    for given in (False, True):
        store = store_at(tmp_path / f"store-{given}")
        _, _, base_weights = store.load("policy", 0)
        base = Decoder(CFG)
        base.load_state_dict(base_weights)
        role = TrainRole(store, "policy", dict(options))
        assert role.base_is_reference
        stats = []
        for step in (0, 1):
            m = message(step)
            if given:
                with torch.no_grad():
                    ref = response_logprobs(base, pack(m.seqs))
                seqs = [msgspec_replace(s, ref_logprobs=ref[i, :len(s.response_ids)].tolist())
                        for i, s in enumerate(m.seqs)]
                m = TrainStep(step=step, seqs=seqs, rank=0, world=1, epoch=1, rendezvous="",
                              total_tokens=m.total_tokens, total_seqs=m.total_seqs)
            stats.append(role.train(m).stats)
        runs.append((stats, role.state_dict()))
    (computed, w1), (given_stats, w2) = runs
    assert computed[0]["kl_ref"] == pytest.approx(0.0, abs=1e-7)  # step 0: policy = base
    assert computed[1]["kl_ref"] > 0  # (the adapters moved the policy off its base)
    for a, b in zip(computed, given_stats, strict=True):
        for key in ("loss", "kl_ref", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-8), key
    for k, w in w1.items():
        torch.testing.assert_close(w2[k], w, rtol=1e-5, atol=1e-7, msg=k)


def test_lora_trainers_in_a_group_take_the_steps_of_one(tmp_path: Path) -> None:
    """Data parallel under LoRA: two ranks (the adapters' gradients summed) take the same three
    steps as one trainer; then a trainer that joins a group later is sent the adapters and
    their AdamW state by the group's broadcast."""
    from test_train_group import OPTS, assert_same, fresh_store, run_trainers, step_msgs

    opts = {**OPTS, "lora_rank": 4, "lora_alpha": 8.0, "lr": 1e-2}
    fresh_store(tmp_path / "solo")
    solo = run_trainers(tmp_path / "solo", [[step_msgs(s, 1, 1, "")[0] for s in range(4)]],
                        opts)[0]
    assert any(k.endswith("lora_B.exp_avg") for k in solo)  # (the state holds the adapters')
    fresh_store(tmp_path / "pair")
    rdv = str(tmp_path / "rdv")
    pair = [[step_msgs(s, 2, 1, rdv)[r] for s in range(4)] for r in range(2)]
    a, b = run_trainers(tmp_path / "pair", pair, opts)
    assert_same(a, solo)
    assert_same(b, solo)
    store = fresh_store(tmp_path / "shared")
    run_trainers(store.root, [[step_msgs(s, 1, 1, "")[0] for s in range(2)]], opts)
    rdv = str(tmp_path / "rdv2")
    b_plan = [step_msgs(2, 1, 2, "", optim_version=2)[0], step_msgs(3, 2, 3, rdv)[0]]
    late = [step_msgs(3, 2, 3, rdv)[1]]
    b, joined = run_trainers(store.root, [b_plan, late], opts)
    assert_same(b, solo)
    assert_same(joined, solo)


def test_the_memory_knobs_take_the_same_lora_steps(tmp_path: Path) -> None:
    """Gradient checkpointing and the chunked head under LoRA: the frozen weights pass no
    gradient of their own through the recomputed layers, and the steps are the same."""
    runs = []
    for knobs in ({}, {"gradient_checkpointing": True, "logits_chunk_tokens": 3}):
        role = TrainRole(store_at(tmp_path / f"store-{len(runs)}"), "policy", {**LORA, **knobs})
        stats = [role.train(message(step)).stats for step in (0, 1)]
        runs.append((role.state_dict(), stats))
    (plain, plain_stats), (knobbed, knobbed_stats) = runs
    for k, w in plain.items():
        torch.testing.assert_close(knobbed[k], w, rtol=1e-4, atol=5e-5, msg=k)
    for a, b in zip(plain_stats, knobbed_stats, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-7)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)


def test_the_adapters_start_from_the_runs_seed(tmp_path: Path) -> None:
    """Every trainer of a run draws the same A (a group's ranks must agree before any
    broadcast); another run seed draws another."""
    def first_a(seed: int, name: str) -> torch.Tensor:
        role = TrainRole(store_at(tmp_path / name), "policy", {**LORA, "seed": seed})
        return role.model.model.layers[0].self_attn.q_proj.lora_A.detach().clone()

    assert torch.equal(first_a(3, "a"), first_a(3, "b"))
    assert not torch.equal(first_a(3, "c"), first_a(4, "d"))
