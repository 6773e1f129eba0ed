"""PPO's critic in the workers: the score role gives the value before each response token as
the trainer computes it and follows the critic's new versions; the trainer steps the critic
toward the returns beside the policy, publishes it with each version, and a trainer that takes
over, or a second data-parallel rank, continues it exactly."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import pytest
import torch
from spawned import run_spawned

from pivotflow.controller.train_tokens import valid_tokens
from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.engines.torch.weights import build_model, config_to_hf
from pivotflow.errors import CheckpointError
from pivotflow.params.optim_entries import load_optim_state
from pivotflow.params.shm_store import ShmParamStore
from pivotflow.protocol import GenerateJob, TrainSeq, TrainStep
from pivotflow.worker import score_role
from pivotflow.worker.reward_scoring import response_values
from pivotflow.worker.score_role import ScoreRole
from pivotflow.worker.train_role import TrainRole, pack

pytestmark = pytest.mark.timeout(120)

POLICY = ModelConfig(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
CRITIC = ModelConfig(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                     num_labels=1)
OPTS = {"lr": 1e-3, "critic_model": "critic", "critic_lr": 1e-2}


def publish_models(root: Path) -> ShmParamStore:
    store = ShmParamStore(root)
    for name, cfg, seed in (("policy", POLICY, 0), ("critic", CRITIC, 1)):
        torch.manual_seed(seed)
        store.publish(name, 0, Decoder(cfg).state_dict(), config_to_hf(cfg, torch.float32))
    return store


def critic_batch(step: int) -> list[TrainSeq]:
    """Sequences with GAE's fields: per-token advantages, the values they came with, and
    returns the critic is to learn."""
    g = torch.Generator().manual_seed(step)
    seqs = []
    for i in range(6):
        p, r = 3 + i % 3, 2 + (i * 5) % 4
        ids = torch.randint(3, 99, (p + r,), generator=g).tolist()
        ret = float(i % 2)
        seqs.append(TrainSeq(job_id=i, prompt_ids=ids[:p], response_ids=ids[p:],
                             logprobs=[-2.0] * r, versions=[step] * r, advantage=0.0,
                             token_advantages=[ret - 0.5] * r, values=[0.0] * r,
                             returns=[ret] * r))
    return seqs


def step_msg(step: int, seqs: list[TrainSeq], rank: int = 0, world: int = 1,
             rendezvous: str = "", optim_version: int = -1) -> TrainStep:
    return TrainStep(step=step, seqs=seqs, rank=rank, world=world, rendezvous=rendezvous,
                     total_tokens=sum(valid_tokens(s) for s in critic_batch(step)),
                     total_seqs=6, optim_version=optim_version)


def critic_of(store: ShmParamStore, version: int) -> dict[str, torch.Tensor]:
    return store.load("critic", version)[2]


def test_the_critic_role_scores_as_the_trainer_does_and_follows_new_versions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = publish_models(tmp_path / "store")
    role = ScoreRole(store, "critic", {"micro_batch_tokens": 64})
    jobs = [GenerateJob(job_id=j, prompt_ids=[5 + j, 6, 7], prefix_ids=[8, 9, 10 + j][: 1 + j],
                        max_tokens=0) for j in range(3)]

    def values_under(tensors: dict[str, torch.Tensor]) -> dict[int, list[float]]:
        model = build_model(CRITIC, tensors, torch.device("cpu"), torch.float32)
        seqs = [TrainSeq(job_id=j.job_id, prompt_ids=j.prompt_ids, response_ids=j.prefix_ids,
                         logprobs=[0.0] * len(j.prefix_ids), versions=[], advantage=0.0)
                for j in jobs]
        with torch.no_grad():
            v = response_values(model, pack(seqs))
        return {s.job_id: v[i, : len(s.response_ids)].tolist() for i, s in enumerate(seqs)}

    def scored(min_version: int) -> dict[int, list[float]]:
        assert role.add([GenerateJob(job_id=j.job_id, prompt_ids=j.prompt_ids,
                                     prefix_ids=j.prefix_ids, max_tokens=0,
                                     min_version=min_version) for j in jobs]) == []
        out = {}
        while role.has_work():
            out.update({d.job_id: d.values for d in role.step()})
        return out

    got = scored(0)
    want = values_under(critic_of(store, 0))
    assert got.keys() == want.keys()
    for j in got:
        assert len(got[j]) == len(jobs[j].prefix_ids)
        torch.testing.assert_close(torch.tensor(got[j]), torch.tensor(want[j]))
    # the trainer publishes a new critic: a job that asks for it is scored with it
    newer = {k: v + 0.1 for k, v in critic_of(store, 0).items()}
    store.publish("critic", 1, newer, store.load("critic")[1])
    got = scored(1)
    assert role.version == 1
    want = values_under(newer)
    for j in got:
        torch.testing.assert_close(torch.tensor(got[j]), torch.tensor(want[j]))
    assert got != values_under(critic_of(store, 0))
    # a version that never comes is a one-line error, after the wait (shortened here)
    monkeypatch.setattr(score_role, "VERSION_WAIT_S", 0.2)
    with pytest.raises(CheckpointError, match=r"critic@v5 was asked for but the store's "
                                              r"latest is v1"):
        role.add([GenerateJob(job_id=9, prompt_ids=[5], prefix_ids=[6], max_tokens=0,
                              min_version=5)])
    role.release()


def test_the_trainer_steps_the_critic_toward_the_returns_and_publishes_it(
        tmp_path: Path) -> None:
    store = publish_models(tmp_path / "store")
    role = TrainRole(store, "policy", OPTS)
    seqs = critic_batch(0)
    errors = []
    for step in range(12):
        # the values a critic stage would give now (its latest version), as the run sends them
        with torch.no_grad():
            v = response_values(role.critic.model, pack(seqs))  # type: ignore[union-attr]
        for i, s in enumerate(seqs):
            s.values = v[i, : len(s.response_ids)].tolist()
        done = role.train(step_msg(step, seqs))
        errors.append(done.stats["value_error"])
        # verl's vf_explained_var over the step's tokens, from the values the step started at
        ret = torch.tensor([x for s in seqs for x in s.returns])
        err = ret - torch.tensor([x for s in seqs for x in s.values])
        want = 1 - err.var(unbiased=False) / (ret.var(unbiased=False) + 1e-8)
        assert done.stats["value_explained_var"] == pytest.approx(float(want), abs=1e-5)
        assert not any(k.startswith("_") for k in done.stats)  # (its moments are not records)
        assert done.stats["critic_grad_norm"] > 0
        # each version carries the critic as the trainer holds it, and its optimizer state
        for k, w in role.critic.model.state_dict().items():  # type: ignore[union-attr]
            assert torch.equal(critic_of(store, step + 1)[k], w), k
        assert store.load("critic.optim", step + 1)[2]["score.weight.step"].item() == step + 1
    assert errors[-1] < 0.5 * errors[0]  # it learns the returns
    assert done.stats["value_explained_var"] > 0.5
    role.release()


def stayed_and_moved(tmp_path: Path, opts: dict) -> tuple[ShmParamStore, ShmParamStore]:
    """Two pools' stores after three steps: one trainer took all three (``a``); one took two
    and another, new, took the pool's state over from the store for the third (``b``)."""
    stayed = publish_models(tmp_path / "a")
    role = TrainRole(stayed, "policy", opts)
    for step in range(3):
        role.train(step_msg(step, critic_batch(step)))
    role.release()
    moved = publish_models(tmp_path / "b")
    first = TrainRole(moved, "policy", opts)
    for step in range(2):
        first.train(step_msg(step, critic_batch(step)))
    first.release()
    second = TrainRole(moved, "policy", opts)
    second.train(step_msg(2, critic_batch(2), optim_version=2))
    second.release()
    return stayed, moved


def test_a_trainer_taking_over_continues_the_critic_exactly(tmp_path: Path) -> None:
    """One trainer for three steps, against one for two and another that takes the pool's
    state from the store for the third: the same critic after it, to the bit."""
    start = critic_of(publish_models(tmp_path / "start"), 0)["score.weight"]
    stayed, moved = stayed_and_moved(tmp_path, OPTS)
    a, b = critic_of(stayed, 3), critic_of(moved, 3)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert not torch.equal(a["score.weight"], start)  # (it moved: the comparison says something)


def rank_proc(root: str, rank: int, world: int, rendezvous: str, zero_stage: int,
              q: mp.Queue) -> None:
    from pivotflow.controller.training import shards

    role = TrainRole(ShmParamStore(root), "policy", {**OPTS, "zero_stage": zero_stage})
    for step in range(2):
        part = shards(critic_batch(step), world)[rank]
        role.train(step_msg(step, part, rank, world, rendezvous))
    q.put(rank)
    role.release()


@pytest.mark.parametrize("zero_stage", [0, 1])  # (1: AdamW's states sharded over the two)
def test_two_data_parallel_trainers_step_the_critic_as_one(tmp_path: Path,
                                                          zero_stage: int) -> None:
    one = publish_models(tmp_path / "one")
    role = TrainRole(one, "policy", OPTS)
    for step in range(2):
        role.train(step_msg(step, critic_batch(step)))
    role.release()
    two_root = tmp_path / "two"
    publish_models(two_root)
    rendezvous = os.path.join(tmp_path, "rdv")
    ranks = run_spawned(rank_proc, [(str(two_root), r, 2, rendezvous, zero_stage)
                                    for r in range(2)])
    assert sorted(ranks) == [0, 1]
    two = ShmParamStore(two_root)
    for name in ("critic", "critic.optim", "policy.optim"):
        a, b = (load_optim_state(s, name.removesuffix(".optim"), 2) if name.endswith(".optim")
                else s.load(name, 2)[2] for s in (one, two))
        assert a.keys() == b.keys()
        for k in a:
            if "k_proj.bias" in k:  # (rounding noise: test_train_group.assert_same says why)
                continue
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=f"{name} {k}")


def test_under_a_critic_warm_up_the_policy_waits_for_the_critic(tmp_path: Path) -> None:
    """verl's critic_warmup: the first steps train the critic alone; the policy's versions
    stay its initial weights until then."""
    store = publish_models(tmp_path / "store")
    role = TrainRole(store, "policy", {**OPTS, "critic_warmup": 2})
    policy = [{k: w.clone() for k, w in store.load("policy", 0)[2].items()}]
    critic = [{k: w.clone() for k, w in critic_of(store, 0).items()}]
    for step in range(3):  # (the store keeps the last three versions: copies as they come)
        role.train(step_msg(step, critic_batch(step)))
        policy.append({k: w.clone() for k, w in store.load("policy", step + 1)[2].items()})
        critic.append({k: w.clone() for k, w in critic_of(store, step + 1).items()})
    role.release()
    for k in policy[1]:  # (v0 holds the tied head too: the trainer publishes it once)
        assert torch.equal(policy[1][k], policy[0][k]) and torch.equal(policy[2][k], policy[0][k])
    assert any(not torch.equal(policy[3][k], policy[0][k]) for k in policy[1])
    assert not torch.equal(critic[1]["score.weight"], critic[0]["score.weight"])


def test_empty_responses_give_the_critic_nothing_to_fit_and_break_nothing(
        tmp_path: Path) -> None:
    """A response may be empty (EOS first): it has no values, returns or advantages. Cut so
    that a micro-batch holds only such responses, the step still fits the rest, and its stats
    are the same keys as any step's (ranks all-reduce them by position)."""
    store = publish_models(tmp_path / "store")
    role = TrainRole(store, "policy", {**OPTS, "micro_batch_tokens": 8})
    seqs = critic_batch(0)
    empty = [TrainSeq(job_id=10 + i, prompt_ids=[5, 6, 7], response_ids=[], logprobs=[],
                      versions=[], advantage=0.0) for i in range(2)]
    full = role.train(step_msg(0, seqs + empty))
    assert full.stats["value_error"] > 0 and full.stats["critic_grad_norm"] > 0
    again = TrainRole(publish_models(tmp_path / "b"), "policy", {**OPTS, "micro_batch_tokens": 8})
    plain = again.train(step_msg(0, critic_batch(0)))
    assert full.stats.keys() == plain.stats.keys()
    assert full.stats["value_error"] == pytest.approx(plain.stats["value_error"])
    role.release()
    again.release()


LORA = {**OPTS, "critic_lora_rank": 4}


def test_a_lora_critic_trains_its_adapters_and_head_and_publishes_them_merged(
        tmp_path: Path) -> None:
    store = publish_models(tmp_path / "store")
    role = TrainRole(store, "policy", LORA)
    critic = role.critic
    assert critic is not None
    trained = {n for n, p in critic.model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_" in n or n == "score.weight" for n in trained)
    assert "score.weight" in trained
    seqs = critic_batch(0)
    errors = []
    for step in range(8):
        with torch.no_grad():
            v = response_values(critic.model, pack(seqs))
        for i, s in enumerate(seqs):
            s.values = v[i, : len(s.response_ids)].tolist()
        errors.append(role.train(step_msg(step, seqs)).stats["value_error"])
    assert errors[-1] < errors[0]
    # the published critic is a plain classifier's weights: it scores as the adapted model
    plain = build_model(CRITIC, critic_of(store, 8), torch.device("cpu"), torch.float32)
    assert not any("lora" in k for k in critic_of(store, 8))
    with torch.no_grad():
        torch.testing.assert_close(response_values(plain, pack(seqs)),
                                   response_values(critic.model, pack(seqs)),
                                   rtol=1e-5, atol=1e-6)
    optim = store.load("critic.optim", 8)[2]
    assert any(k.endswith(".lora_B") for k in optim)
    role.release()


def test_a_trainer_taking_over_a_lora_critic_continues_it(tmp_path: Path) -> None:
    """As for a whole critic: the taker loads the merged critic and the adapters, takes their
    update back out of the body, and continues to the same critic (float32 rounding apart)."""
    stayed, moved = stayed_and_moved(tmp_path, LORA)
    a, b = critic_of(stayed, 3), critic_of(moved, 3)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)
    # an optimizer state without the adapters is a one-line error naming them
    broken = TrainRole(publish_models(tmp_path / "c"), "policy", LORA)
    config = moved.load("critic")[1]
    broken.store.publish("critic", 2, critic_of(moved, 2), config)
    broken.store.publish("critic.optim", 2, {k: v for k, v in
                                             moved.load("critic.optim", 2)[2].items()
                                             if ".lora_" not in k}, config)
    with pytest.raises(CheckpointError, match=r"critic.optim@v2 has no LoRA adapter .* "
                                              r"\(critic_lora_rank 4\)"):
        broken.critic.load_from_store(2)  # type: ignore[union-attr]
    broken.release()


def test_the_critic_takes_one_update_a_mini_batch_as_the_policy_does(tmp_path: Path) -> None:
    from pivotflow.controller.training import mini_batch_shards

    seqs = critic_batch(0)
    rank_seqs, sizes, tokens, counted = mini_batch_shards(seqs, 2, 1)
    cut = TrainRole(publish_models(tmp_path / "a"), "policy", {**OPTS, "mini_batches": 2})
    cut.train(TrainStep(step=0, seqs=rank_seqs[0], part_sizes=sizes[0], part_tokens=tokens,
                        part_seqs=counted))
    plain = TrainRole(publish_models(tmp_path / "b"), "policy", OPTS)
    for step, half in enumerate((seqs[:3], seqs[3:])):
        plain.train(TrainStep(step=step, seqs=half))
    a = cut.critic.model.state_dict()  # type: ignore[union-attr]
    b = plain.critic.model.state_dict()  # type: ignore[union-attr]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
    cut.release()
    plain.release()
