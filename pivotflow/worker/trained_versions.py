"""A trained model's versions in the parameter store, for the policy's trainer and the critic's.

Each version goes with its AdamW state, so a trainer that leaves or dies takes neither along:
every rank publishes its part of the state (``publish_state``: rank 0 the whole of a replicated
state, each rank its chunks of a sharded one, ``params/optim_entries.py``), the group waits for
every part, then rank 0 publishes the weights (``publish_version``); each is kept as many
versions as the store agents keep on every node (``node_agent.KEEP``, ``KEEP_OPTIM``). A trainer
that takes over a model it did not train last loads both, waiting for the state a while (on a
cluster it may still be crossing to this node's store), and under LoRA takes the adapters out
of that state and their update back out of the published, merged weights."""

from __future__ import annotations

import torch

from pivotflow.errors import CheckpointError
from pivotflow.params.base import ParamStore
from pivotflow.params.node_agent import KEEP, KEEP_OPTIM
from pivotflow.params.optim_entries import publish_part, retire_stale, stored_extras
from pivotflow.worker.group_adam import GroupAdam, StoreCopy
from pivotflow.worker.lora import restore
from pivotflow.worker.train_group import TrainGroup


def publish_state(store: ParamStore, name: str, version: int, optim: GroupAdam,
                  group: TrainGroup, extra: dict[str, torch.Tensor], config: dict) -> list[str]:
    """This rank's part of ``name``'s optimizer state at ``version`` (``extra``, the LoRA
    adapters, go with rank 0's); returns the names published ([]: this rank publishes none)."""
    part = optim.state_part(group)
    if part is None:
        return []
    tensors = {**part.tensors, **extra} if group.rank == 0 else part.tensors
    published = [publish_part(store, name, version, tensors, part.shard, config, KEEP_OPTIM)]
    if part.shard is not None and group.rank == 0:  # what this layout does not write, retired
        published += retire_stale(store, name, part.shard["world"], version, KEEP_OPTIM)
    return published


def publish_version(store: ParamStore, name: str, version: int,
                    weights: dict[str, torch.Tensor], config: dict) -> list[str]:
    """Publish ``name@version`` (by rank 0, once every rank's part of its optimizer state is
    published) and collect the older ones; returns the names published."""
    store.publish(name, version, weights, config)
    store.gc(name, keep=KEEP)
    return [name]


def take_over(store: ParamStore, name: str, version: int, model: torch.nn.Module,
              optim: GroupAdam, rank_knob: str, rank: int) -> None:
    """Load ``name@version`` and its optimizer state into ``model`` and ``optim``; under LoRA
    (``rank`` > 0, set by the knob ``rank_knob``) the adapters, and the frozen weights as the
    published ones less the adapters' update. A state without this run's adapters is a
    one-line CheckpointError naming the first."""
    _, _, tensors = store.load(name, version)
    model.load_state_dict(tensors, strict=False)
    bad = restore(model, stored_extras(store, name, version))
    if bad:
        raise CheckpointError(f"optimizer state {name}.optim@v{version} has no LoRA adapter "
                              f"{bad[0]!r} of this run's shape ({rank_knob} {rank}); "
                              f"{len(bad)} missing or misshaped")
    optim.take_over(StoreCopy(store, name, version))
