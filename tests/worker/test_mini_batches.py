"""Several optimizer updates a step (``mini_batches``, ``epochs``; verl's ppo_mini_batch_size and
ppo_epochs, TRL's num_iterations): a step cut into mini-batches is the same as one step per
mini-batch, on one trainer or two, and from the second update on the policy has moved from the
one that sampled, so the clip acts."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import pytest
import torch
from spawned import run_spawned

from pivotflow.controller.train_tokens import valid_tokens
from pivotflow.controller.training import mini_batch_shards
from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.engines.torch.weights import config_to_hf
from pivotflow.params.shm_store import ShmParamStore
from pivotflow.protocol import TrainSeq, TrainStep
from pivotflow.worker.response_scoring import response_logprobs
from pivotflow.worker.train_role import TrainRole, pack

pytestmark = pytest.mark.timeout(120)

CFG = ModelConfig(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
OPTS = {"lr": 1e-2}


def store_at(root: Path) -> ShmParamStore:
    store = ShmParamStore(root)
    torch.manual_seed(0)
    store.publish("policy", 0, Decoder(CFG).state_dict(), config_to_hf(CFG, torch.float32))
    return store


def batch(n: int = 8) -> list[TrainSeq]:
    g = torch.Generator().manual_seed(0)
    seqs = []
    for i in range(n):
        p, r = 3 + i % 3, 2 + (i * 5) % 4
        ids = torch.randint(3, 99, (p + r,), generator=g).tolist()
        seqs.append(TrainSeq(job_id=i, prompt_ids=ids[:p], response_ids=ids[p:],
                             logprobs=[-2.0] * r, versions=[0] * r,
                             advantage=float(i % 3) - 1.0))
    return seqs


def sampled_by(role: TrainRole, seqs: list[TrainSeq]) -> list[TrainSeq]:
    """The sequences with the logprobs the role's current weights give (as if it sampled them)."""
    with torch.no_grad():
        logp = response_logprobs(role.model, pack(seqs))
    for i, s in enumerate(seqs):
        s.logprobs = logp[i, : len(s.response_ids)].tolist()
    return seqs


def steps_for(seqs: list[TrainSeq], k: int, world: int) -> list[TrainStep]:
    rank_seqs, sizes, tokens, counted = mini_batch_shards(seqs, k, world)
    return [TrainStep(step=0, seqs=rs, rank=r, world=len(rank_seqs), part_sizes=sz,
                      part_tokens=tokens, part_seqs=counted,
                      rendezvous="" if len(rank_seqs) == 1 else "unused")
            for r, (rs, sz) in enumerate(zip(rank_seqs, sizes, strict=True))]


def test_mini_batches_are_the_same_sequences_whatever_the_ranks() -> None:
    seqs = batch(8)
    one, sizes1, tokens, counted = mini_batch_shards(seqs, 2, 1)
    two, sizes2, tokens2, _ = mini_batch_shards(seqs, 2, 2)
    assert sizes1 == [[4, 4]] and tokens == tokens2
    assert [s.job_id for s in one[0]] == list(range(8))
    # each rank holds a part of each mini-batch (balanced by tokens), and together the parts
    # are the mini-batch, whatever the number of ranks
    for j, members in enumerate((range(4), range(4, 8))):
        held = []
        for rank_seqs, sizes in zip(two, sizes2, strict=True):
            at = sum(sizes[:j])
            held += [s.job_id for s in rank_seqs[at: at + sizes[j]]]
        assert sorted(held) == list(members) and all(sz[j] > 0 for sz in sizes2)
    assert tokens == [sum(valid_tokens(s) for s in seqs[:4]),
                      sum(valid_tokens(s) for s in seqs[4:])] and counted == [4, 4]
    # no rank without a sequence in some mini-batch: 3 parts of 2 or 3 take 2 ranks of 4
    ranks, sizes, _, _ = mini_batch_shards(batch(7), 3, 4)
    assert len(ranks) == 2 and all(all(n > 0 for n in sz) for sz in sizes)


def test_a_step_of_two_mini_batches_is_two_steps(tmp_path: Path) -> None:
    seqs = batch(8)
    cut = TrainRole(store_at(tmp_path / "a"), "policy", {**OPTS, "mini_batches": 2})
    done = cut.train(steps_for(seqs, 2, 1)[0])
    plain = TrainRole(store_at(tmp_path / "b"), "policy", OPTS)
    for step, half in enumerate((seqs[:4], seqs[4:])):
        plain.train(TrainStep(step=step, seqs=half))
    a, b = cut.state_dict(), plain.state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
    assert {float(st["step"]) for st in cut.optim.optim.state.values()} == {2.0}  # two updates
    assert done.version == 1  # one version for the step
    cut.release()
    plain.release()


def test_from_the_second_update_on_the_clip_acts(tmp_path: Path) -> None:
    """Sampled by the step's first weights, the first update's ratio is 1 everywhere; the
    second pass (epochs 2) sees the policy the first moved: ratios off 1, some clipped."""
    stats = {}
    for epochs in (1, 2):
        role = TrainRole(store_at(tmp_path / f"e{epochs}"), "policy",
                         {"lr": 0.2, "epochs": epochs})
        seqs = sampled_by(role, batch(8))
        stats[epochs] = role.train(TrainStep(step=0, seqs=seqs)).stats
        role.release()
    assert stats[1]["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert stats[1]["clip_frac"] == 0.0
    assert stats[2]["approx_kl"] > 1e-4 and stats[2]["clip_frac"] > 0


def test_the_decoupled_loss_keeps_the_steps_first_weights_as_proximal(tmp_path: Path) -> None:
    """With two updates the proximal policy is the weights the step started from (scored
    once), so the second update's ratio to it moves; were it each forward's own, every ratio
    would be 1 and nothing would ever clip."""
    role = TrainRole(store_at(tmp_path / "d"), "policy",
                     {"lr": 0.2, "epochs": 2, "decoupled_loss": True})
    seqs = sampled_by(role, batch(8))
    stats = role.train(TrainStep(step=0, seqs=seqs)).stats
    assert stats["clip_frac"] > 0 and stats["approx_kl"] > 1e-4
    # the rollout's and the step's first weights are the same here: behaviour weights of 1
    assert stats["behavior_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    role.release()


def rank_proc(root: str, msg: TrainStep, q: mp.Queue) -> None:
    role = TrainRole(ShmParamStore(root), "policy", {**OPTS, "mini_batches": 2})
    q.put((msg.rank, role.train(msg).stats["tokens"]))
    role.release()


def test_two_trainers_take_the_same_mini_batch_updates_as_one(tmp_path: Path) -> None:
    seqs = batch(8)
    one = store_at(tmp_path / "one")
    role = TrainRole(one, "policy", {**OPTS, "mini_batches": 2})
    role.train(steps_for(seqs, 2, 1)[0])
    role.release()
    two_root = tmp_path / "two"
    store_at(two_root)
    rendezvous = os.path.join(tmp_path, "rdv")
    msgs = [TrainStep(step=m.step, seqs=m.seqs, rank=m.rank, world=m.world,
                      rendezvous=rendezvous, part_sizes=m.part_sizes,
                      part_tokens=m.part_tokens, part_seqs=m.part_seqs)
            for m in steps_for(seqs, 2, 2)]
    total = float(sum(valid_tokens(s) for s in seqs))  # (each rank reports the step's)
    assert sorted(run_spawned(rank_proc, [(str(two_root), m) for m in msgs])) == [
        (0, total), (1, total)]
    a, b = one.load("policy", 1)[2], ShmParamStore(two_root).load("policy", 1)[2]
    for k in a:  # (float rounding of the summed gradients, which Adam scales up near 0)
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.parametrize("knobs", [{}, {"micro_batch_tokens": 5}, {"mini_batches": 2},
                                   {"mini_batches": 2, "epochs": 2, "micro_batch_tokens": 4}])
def test_a_steps_tokens_are_all_it_trained_however_it_is_cut(tmp_path: Path,
                                                              knobs: dict) -> None:
    """``train_tokens`` is the step's valid tokens, whatever its micro-batches, mini-batches
    and epochs (before 12-06 a token-weighted mean of its micro-batches' sizes: 122 of a
    244-token step on two trainers)."""
    seqs = batch(8)
    role = TrainRole(store_at(tmp_path / "t"), "policy", {**OPTS, **knobs})
    msg = (steps_for(seqs, 2, 1)[0] if knobs.get("mini_batches")
           else TrainStep(step=0, seqs=seqs))
    assert role.train(msg).stats["tokens"] == sum(valid_tokens(s) for s in seqs)
    role.release()
