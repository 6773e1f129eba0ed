"""A sharded AdamW state in the store (``params/optim_entries.py``): every rank's shard joins into
the replicated layout's entries, and a state is whole only when one publish's every shard is
there. The shards are what real ShardedAdamW ranks publish (cut by hand: each rank's chunks are
taken from one optimizer that stepped the whole model)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pivotflow.errors import CheckpointError
from pivotflow.params.node_agent import KEEP, KEEP_OPTIM, keep_for
from pivotflow.params.optim_entries import (
    StoredState,
    chunk_name,
    is_optim,
    load_optim_state,
    publish_part,
    retire_stale,
    shard_name,
    shard_rank,
)
from pivotflow.params.shm_store import ShmParamStore
from pivotflow.worker.adam_state import adam_tensors
from pivotflow.worker.group_adam import ReplicatedAdamW
from pivotflow.worker.sharded_adam import ShardedAdamW
from pivotflow.worker.train_group import TrainGroup

pytestmark = pytest.mark.timeout(60)
HF = {"model_type": "toy"}


def stepped() -> tuple[torch.nn.Module, ReplicatedAdamW]:
    """A model whose weights the buckets below cut mid-weight, after two AdamW steps."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Linear(5, 3))
    opt = ReplicatedAdamW(model, lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 7)).pow(2).sum().backward()
        opt.step(TrainGroup(), max_grad_norm=1.0)
    return model, opt


def shards_of(model: torch.nn.Module, opt: ReplicatedAdamW, world: int, epoch: int = 4
              ) -> list[tuple[dict[str, torch.Tensor], dict]]:
    """What each of ``world`` sharded ranks would publish for ``opt``'s state."""
    whole = adam_tensors(model, opt.optim)
    out = []
    for rank in range(world):
        cut = ShardedAdamW(model, lr=0.1, bucket_elems=16)
        cut.layout, cut.world, cut.rank, cut.steps = (epoch, world, rank), world, rank, 2
        cut.chunks = {}
        for key in ("exp_avg", "exp_avg_sq"):
            tensors = [whole[f"{n}.{key}"] for n, _ in cut.named]
            cut.chunks[key] = []
            for b in range(len(cut.buckets)):
                chunk = torch.zeros(cut.flat.chunk(b, world))
                cut._read(tensors, *cut.flat.owned(b, world, rank), chunk)
                cut.chunks[key].append(chunk)
        part = cut.state_part(TrainGroup())
        out.append((part.tensors, part.shard))
    return out


def test_every_ranks_shard_joins_into_the_replicated_entries(tmp_path: Path) -> None:
    model, opt = stepped()
    store = ShmParamStore(tmp_path / "store")
    for rank, (tensors, shard) in enumerate(shards_of(model, opt, world=3)):
        extra = {"lora_A": torch.ones(2)} if rank == 0 else {}  # rank 0 carries the adapters
        assert publish_part(store, "policy", 2, {**tensors, **extra}, shard, HF,
                            KEEP_OPTIM) == shard_name("policy", rank)
    got = load_optim_state(store, "policy", 2)
    want = adam_tensors(model, opt.optim)
    assert list(got) == [*want, "lora_A"]  # the replicated layout's names, in its order
    for k, v in want.items():
        assert torch.equal(got[k], v), k
    assert store.load("policy.optim.r1", 2)[1]["model_type"] == "toy"  # with its model's config


def test_a_state_missing_a_shard_or_mixing_two_publishes_is_not_whole(tmp_path: Path) -> None:
    model, opt = stepped()
    store = ShmParamStore(tmp_path / "store")
    (t0, s0), (t1, s1) = shards_of(model, opt, world=2)
    publish_part(store, "policy", 2, t0, s0, HF, KEEP_OPTIM)
    with pytest.raises(CheckpointError, match=r"^optimizer state policy.optim@v2 never reached "
                                              r"the parameter store whole \(waited 0.05 s\)$"):
        load_optim_state(store, "policy", 2, wait_s=0.05)
    (_, _), (stale, stale_shard) = shards_of(model, opt, world=2, epoch=3)
    publish_part(store, "policy", 2, stale, stale_shard, HF, KEEP_OPTIM)  # another group's
    with pytest.raises(CheckpointError, match="never reached"):
        load_optim_state(store, "policy", 2, wait_s=0.05)
    publish_part(store, "policy", 2, t1, s1, HF, KEEP_OPTIM)
    assert set(load_optim_state(store, "policy", 2)) == set(adam_tensors(model, opt.optim))


def test_shards_are_optimizer_states_to_the_store_agents() -> None:
    assert [is_optim(n) for n in ("policy.optim", "policy.optim.r12", "policy", "optim.r1x",
                                  "critic.optim.r0")] == [True, True, False, False, True]
    assert keep_for("policy.optim.r3") == KEEP_OPTIM and keep_for("policy") == KEEP
    assert chunk_name("exp_avg", 3) == "#exp_avg.3"
    # a shard's rank is read from its name only for that model's state
    assert [shard_rank("policy", n) for n in ("policy.optim.r12", "policy.optim", "policy",
                                             "critic.optim.r0", "policy.optim.rx")] == [
        12, None, None, None, None]


def test_the_whole_entry_is_what_a_replicated_rank_publishes(tmp_path: Path) -> None:
    model, opt = stepped()
    store = ShmParamStore(tmp_path / "store")
    part = opt.state_part(TrainGroup())
    assert part is not None and part.shard is None
    assert publish_part(store, "policy", 2, part.tensors, None, HF, KEEP_OPTIM) == "policy.optim"
    got = load_optim_state(store, "policy", 2)
    assert all(torch.equal(got[k], v) for k, v in part.tensors.items())


@pytest.mark.parametrize("stored_world", [0, 1, 3])  # 0: the whole entry (a resume's)
def test_a_new_layout_reads_its_chunks_from_any_stored_layout(tmp_path: Path,
                                                             stored_world: int) -> None:
    """What each rank of a re-cut group reads (``StoredState.read``) is its new chunk of the
    stored state, whichever layout stored it: shards of 1 or 3 ranks, or the whole entry."""
    model, opt = stepped()
    store = ShmParamStore(tmp_path / "store")
    if stored_world:
        for tensors, shard in shards_of(model, opt, world=stored_world):
            publish_part(store, "policy", 2, tensors, shard, HF, KEEP_OPTIM)
    else:
        publish_part(store, "policy", 2, adam_tensors(model, opt.optim), None, HF, KEEP_OPTIM)
    whole = adam_tensors(model, opt.optim)
    cut = ShardedAdamW(model, lr=0.1, bucket_elems=16)
    names = [n for n, _ in cut.named]
    held = StoredState.wait(store, "policy", 2)
    held.check(names, [tuple(p.shape) for _, p in cut.named])
    assert held.steps == 2 and held.keys == ("exp_avg", "exp_avg_sq")
    for rank in range(2):
        for b in range(len(cut.buckets)):
            lo, hi = cut.flat.owned(b, 2, rank)
            got, want = torch.zeros(cut.flat.chunk(b, 2)), torch.zeros(cut.flat.chunk(b, 2))
            held.read("exp_avg_sq", cut.flat, lo, hi, got)
            cut._read([whole[f"{n}.exp_avg_sq"] for n in names], lo, hi, want)
            assert torch.equal(got, want), (rank, b)


def test_a_checkpoint_streams_the_joined_shards_to_its_optimizer_file(tmp_path: Path) -> None:
    """The controller writes ``optimizer.safetensors`` from the shards, joining one entry at a
    time: the file is the replicated layout's state, which a resume publishes whole."""
    from safetensors.torch import load_file

    from pivotflow import checkpoints
    from pivotflow.controller.snapshot import ControllerState

    model, opt = stepped()
    store = ShmParamStore(tmp_path / "store")
    store.publish("policy", 2, {k: v.detach() for k, v in model.state_dict().items()}, HF)
    for tensors, shard in shards_of(model, opt, world=2):
        publish_part(store, "policy", 2, tensors, shard, HF, KEEP_OPTIM)
    state = ControllerState(version=2, tokens_generated=0, ledger={}, settled_below=0,
                            settled_above=[], open_groups={}, next_sample=0,
                            source_rng=[3, [0] * 625, None], problems_cursor=0,
                            problems_rng=[3, [0] * 625, None], samples=[])
    path = checkpoints.write(tmp_path / "run", "policy", store, state)
    saved = load_file(path / "optimizer.safetensors")
    want = adam_tensors(model, opt.optim)
    assert set(saved) == set(want)
    for k, v in want.items():
        assert torch.equal(saved[k], v), k


def test_entries_a_sharded_group_does_not_write_are_retired_two_publishes_on(
        tmp_path: Path) -> None:
    """A resume's whole entry, and the shard of a rank that left, get empty placeholders from
    rank 0 of the group after them: two publishes on, the store's collection has dropped what
    they held (the version before each publish stays, for a step redone from it)."""
    model, opt = stepped()
    store = ShmParamStore(tmp_path / "store")
    whole = adam_tensors(model, opt.optim)
    publish_part(store, "policy", 2, whole, None, HF, KEEP_OPTIM)  # (a resume's)
    for tensors, shard in shards_of(model, opt, world=3, epoch=3):
        publish_part(store, "policy", 3, tensors, shard, HF, KEEP_OPTIM)
    for version in (4, 5, 6):  # a group of two from here on
        for tensors, shard in shards_of(model, opt, world=2, epoch=4):
            publish_part(store, "policy", version, tensors, shard, HF, KEEP_OPTIM)
        retired = retire_stale(store, "policy", 2, version, KEEP_OPTIM)
        assert retired == ([] if version == 6 else ["policy.optim", "policy.optim.r2"])
        if version == 4:  # the versions before are whole still
            assert set(load_optim_state(store, "policy", 3)) == set(whole)
            assert set(load_optim_state(store, "policy", 2)) == set(whole)
    assert store.versions("policy.optim") == [4, 5] and store.versions("policy.optim.r2") == [4, 5]
    assert not store.load("policy.optim", 5)[2] and not store.load("policy.optim.r2", 5)[2]
    assert set(load_optim_state(store, "policy", 6)) == set(whole)  # the group's own
    with pytest.raises(CheckpointError, match="never reached"):  # a placeholder is no state
        publish_part(store, "critic", 1, {}, None, {"optim_placeholder": True}, KEEP_OPTIM)
        load_optim_state(store, "critic", 1, wait_s=0)
