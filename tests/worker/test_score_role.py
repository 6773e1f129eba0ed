"""The score role (a reference model): it scores a response token by token exactly as the
trainer does and as the engine that sampled it did, refuses what it cannot read by name, and
aborts without partial state."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pivotflow.engines.torch.weights import load_model_folder
from pivotflow.params.shm_store import ShmParamStore
from pivotflow.protocol import GenerateJob, TrainSeq
from pivotflow.worker.generate_role import GenerateRole
from pivotflow.worker.host import RoleHost
from pivotflow.worker.response_scoring import response_logprobs
from pivotflow.worker.score_role import SCORED, ScoreRole
from pivotflow.worker.train_role import TrainRole, pack


def published(tmp_path: Path, folder: Path) -> ShmParamStore:
    """The policy at v0 and its frozen copy, as a run with a reference stage publishes them."""
    model = load_model_folder(folder)
    store = ShmParamStore(tmp_path / "store")
    for name in ("policy", "policy.ref"):
        store.publish(name, 0, model.tensors, model.hf_config)
    return store


def drain(role: ScoreRole) -> dict[int, list[float]]:
    out = {}
    while role.has_work():
        out.update(drain_one(role))
    return out


def test_it_scores_as_the_sampling_engine_and_the_trainer_do(
    tmp_path: Path, random_models: dict[str, Path]
) -> None:
    store = published(tmp_path, random_models["policy"])
    gen = GenerateRole(store, "policy", {"engine": "torch", "max_batch": 4})
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13, 14], [20]]
    gen.add([GenerateJob(job_id=i, prompt_ids=p, max_tokens=12, temperature=1.0, seed=i)
             for i, p in enumerate(prompts)])
    sampled = {}
    while gen.has_work():
        sampled.update({d.job_id: d for d in gen.step()})
    # micro_batch_tokens small enough that the three are scored in more than one pass
    ref = ScoreRole(store, "policy.ref", {"micro_batch_tokens": 24})
    assert ref.add([GenerateJob(job_id=i, prompt_ids=p, max_tokens=0,
                                prefix_ids=sampled[i].token_ids)
                    for i, p in enumerate(prompts)]) == []
    passes = 0
    scores: dict[int, list[float]] = {}
    while ref.has_work():
        passes += 1
        scores.update(drain_one(ref))
    assert passes > 1 and sorted(scores) == [0, 1, 2]
    trainer = TrainRole(store, "policy", {"lr": 1e-3})
    seqs = [TrainSeq(job_id=i, prompt_ids=p, response_ids=sampled[i].token_ids,
                     logprobs=sampled[i].logprobs, versions=sampled[i].versions, advantage=0.0)
            for i, p in enumerate(prompts)]
    with torch.no_grad():
        trained = response_logprobs(trainer.model, pack(seqs))
    for i, _ in enumerate(prompts):
        n = len(sampled[i].token_ids)
        assert len(scores[i]) == n > 0
        # the engine's own logprobs at temperature 1 (a KV-cached decode, float32)
        assert scores[i] == pytest.approx(sampled[i].logprobs, abs=1e-4)
        # the trainer's forward over the whole batch, padded: the same numbers
        assert scores[i] == pytest.approx(trained[i, :n].tolist(), abs=1e-5)


def drain_one(role: ScoreRole) -> dict[int, list[float]]:
    """One step's scores (one micro-batch)."""
    out = {}
    for done in role.step():
        assert done.finish_reason == SCORED and done.error == "" and done.token_ids == []
        assert done.versions == [0] * len(done.logprobs)
        out[done.job_id] = done.logprobs
    return out


def test_what_it_cannot_score_is_refused_by_name_and_the_rest_scored(
    tmp_path: Path, random_models: dict[str, Path]
) -> None:
    store = published(tmp_path, random_models["policy"])
    ref = ScoreRole(store, "policy.ref", {})
    vocab, context = ref.config.vocab_size, ref.config.max_position_embeddings
    bad = {
        1: GenerateJob(job_id=1, prompt_ids=[5], max_tokens=0, prefix_ids=[]),
        2: GenerateJob(job_id=2, prompt_ids=[5], max_tokens=0, prefix_ids=[vocab]),
        3: GenerateJob(job_id=3, prompt_ids=[5] * context, max_tokens=0, prefix_ids=[6]),
    }
    good = GenerateJob(job_id=4, prompt_ids=[5, 6], max_tokens=0, prefix_ids=[7, 8])
    refused = {d.job_id: d for d in ref.add([*bad.values(), good])}
    assert sorted(refused) == [1, 2, 3]
    assert all(d.finish_reason == "error" for d in refused.values())
    assert "a prompt and a response" in refused[1].error
    assert f"token id {vocab} is outside" in refused[2].error
    assert f"max_position_embeddings {context}" in refused[3].error
    assert list(drain(ref)) == [4]


def test_a_host_serves_it_and_an_abort_drops_the_queue(
    tmp_path: Path, random_models: dict[str, Path]
) -> None:
    from pivotflow.protocol import AbortJobs, AssignRole, Jobs, JobsDone, RoleReady

    host = RoleHost("w0", published(tmp_path, random_models["policy"]))
    [ready] = host.handle(AssignRole(role="score", model="policy.ref", options={}))
    assert isinstance(ready, RoleReady) and ready.version == 0 and ready.load_s > 0
    jobs = [GenerateJob(job_id=i, prompt_ids=[5, 6], max_tokens=0, prefix_ids=[7] * (i + 1))
            for i in range(3)]
    assert host.handle(Jobs(jobs=jobs)) == [] and host.has_work()
    [aborted] = host.handle(AbortJobs(job_ids=[1, 2]))
    assert isinstance(aborted, JobsDone)
    assert sorted(r.job_id for r in aborted.results) == [1, 2]
    assert {r.finish_reason for r in aborted.results} == {"abort"}
    [done] = host.step()
    assert isinstance(done, JobsDone) and [r.job_id for r in done.results] == [0]
    assert not host.has_work()
    host.release()
