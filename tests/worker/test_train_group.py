"""Trainers as a data-parallel group (real processes, gloo on loopback): the same step on one
trainer or on two gives the same weights, and a trainer that joins later takes over exactly the
state the pool had — from the group by broadcast, or from the parameter store."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest
import torch
from spawned import run_spawned

from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.engines.torch.weights import config_to_hf
from pivotflow.params.optim_entries import load_optim_state
from pivotflow.params.shm_store import ShmParamStore
from pivotflow.protocol import TrainSeq, TrainStep
from pivotflow.worker.adam_state import adam_tensors
from pivotflow.worker.group_adam import ReplicatedAdamW
from pivotflow.worker.train_role import TrainRole

pytestmark = pytest.mark.timeout(120)

CFG = ModelConfig(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
HF = config_to_hf(CFG, torch.float32)  # what the store holds: the model's config.json
OPTS = {"lr": 1e-2}


def batch(step: int) -> list[TrainSeq]:
    g = torch.Generator().manual_seed(step)
    seqs = []
    for i in range(6):
        p, r = 3 + i % 3, 2 + (i * 5) % 4
        ids = torch.randint(3, 99, (p + r,), generator=g).tolist()
        seqs.append(TrainSeq(job_id=i, prompt_ids=ids[:p], response_ids=ids[p:],
                             logprobs=[-2.0] * r, versions=[step] * r,
                             advantage=float(i % 3) - 1.0))
    return seqs


def step_msgs(step: int, world: int, epoch: int, rendezvous: str,
              optim_version: int = -1) -> list[TrainStep]:
    from pivotflow.controller.train_tokens import valid_tokens
    from pivotflow.controller.training import shards

    seqs = batch(step)
    parts = shards(seqs, world)
    return [TrainStep(step=step, seqs=part, rank=r, world=world, epoch=epoch,
                      rendezvous=rendezvous if world > 1 else "",
                      total_tokens=sum(valid_tokens(s) for s in seqs), total_seqs=len(seqs),
                      optim_version=optim_version if r == 0 else -1)
            for r, part in enumerate(parts)]


def trainer_proc(root: str, plan: list[TrainStep], opts: dict | None, out: mp.Queue) -> None:
    """One trainer process: run its TrainSteps, then report the final state it holds."""
    torch.manual_seed(0)
    role = TrainRole(ShmParamStore(root), "policy", opts or OPTS)
    for msg in plan:
        role.train(msg)
    # (every rank's whole state when replicated; when sharded, rank 0 reads it whole from
    # the store: every rank's shard joined)
    adam = (adam_tensors(role.model, role.optim.optim) if isinstance(role.optim, ReplicatedAdamW)
            else load_optim_state(role.store, "policy", role.version) if role.group.rank == 0
            else {})
    state = {**role.state_dict(), **adam}
    out.put({k: v.detach().numpy().copy() for k, v in state.items()})  # no shared-memory fds
    role.release()


def run_trainers(root: Path, plans: list[list[TrainStep]],
                 opts: dict | None = None) -> list[dict[str, torch.Tensor]]:
    return [{k: torch.from_numpy(v) for k, v in held.items()}
            for held in run_spawned(trainer_proc, [(str(root), plan, opts) for plan in plans])]


def fresh_store(root: Path) -> ShmParamStore:
    """A store holding only policy@v0 (the same random weights every time)."""
    s = ShmParamStore(root)
    torch.manual_seed(0)
    s.publish("policy", 0, Decoder(CFG).state_dict(), config_to_hf(CFG, torch.float32))
    return s


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        # The key bias's exact gradient is zero (softmax ignores a shift shared by all keys of
        # a query), so its float gradient is rounding noise, which Adam scales to full steps.
        if "k_proj.bias" in k:
            continue
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6, msg=k)


def test_two_trainers_take_the_same_steps_as_one(tmp_path: Path) -> None:
    start = fresh_store(tmp_path / "solo").load("policy", 0)[2]
    solo = run_trainers(tmp_path / "solo", [[step_msgs(s, 1, 1, "")[0] for s in range(3)]])[0]
    fresh_store(tmp_path / "pair")
    rdv = str(tmp_path / "rdv")
    pair = [[step_msgs(s, 2, 1, rdv)[r] for s in range(3)] for r in range(2)]
    a, b = run_trainers(tmp_path / "pair", pair)
    assert_same(a, solo)
    assert_same(b, solo)  # every rank holds the same weights and optimizer state
    assert sum(float((a[k] - start[k]).abs().sum()) for k in start.keys() & a.keys()) > 0


def test_a_trainer_that_joins_later_takes_over_the_state(tmp_path: Path) -> None:
    fresh_store(tmp_path / "solo")
    solo = run_trainers(tmp_path / "solo", [[step_msgs(s, 1, 1, "")[0] for s in range(4)]])[0]
    store = fresh_store(tmp_path / "shared")
    # trainer A alone for steps 0-1, then leaves (its optimizer state goes to the store);
    # B joins and takes step 2 alone from the store's state, then A comes back for step 3
    # and the group broadcasts B's state to it.
    run_trainers(store.root, [[step_msgs(s, 1, 1, "")[0] for s in range(2)]])
    assert store.latest("policy.optim") == 2
    rdv = str(tmp_path / "rdv")
    b_plan = [step_msgs(2, 1, 2, "", optim_version=2)[0], step_msgs(3, 2, 3, rdv)[0]]
    a_plan = [step_msgs(3, 2, 3, rdv)[1]]
    b, a = run_trainers(store.root, [b_plan, a_plan])
    assert_same(b, solo)
    assert_same(a, solo)


def test_float32_masters_under_bf16_compute_publish_the_loaded_dict(tmp_path: Path) -> None:
    store = ShmParamStore(tmp_path / "store")
    torch.manual_seed(0)
    hf = {**HF, "dtype": "bfloat16", "torch_dtype": "bfloat16", "user_key": [1, {"a": None}]}
    store.publish("policy", 0, {k: v.bfloat16() for k, v in Decoder(CFG).state_dict().items()},
                  hf)
    role = TrainRole(store, "policy", {**OPTS, "dtype": "auto"})  # auto: the config's bf16
    assert role.autocast == torch.bfloat16
    done = role.train(step_msgs(0, 1, 1, "")[0])
    assert done.version == 1 and done.stats["grad_norm"] > 0
    version, config, tensors = store.load("policy")
    assert (version, config) == (1, hf)
    assert {t.dtype for t in tensors.values()} == {torch.float32}
    assert store.load("policy.optim")[1] == hf
    role.release()
