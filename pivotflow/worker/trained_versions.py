"""A trained model's versions in the parameter store, for the policy's trainer and the critic's.

Rank 0 publishes each version with its AdamW state (``<model>.optim``), so a trainer that leaves
or dies takes neither along, and keeps as many of each as the store agents keep on every node
(``node_agent.KEEP``, ``KEEP_OPTIM``). A trainer that takes over a model it did not train last
loads both, waiting for the state a while (on a cluster it may still be crossing to this node's
store), and under LoRA takes the adapters out of that state and their update back out of the
published, merged weights."""

from __future__ import annotations

import time

import torch

from pivotflow.errors import CheckpointError, WorkerError
from pivotflow.params.base import ParamStore
from pivotflow.params.node_agent import KEEP, KEEP_OPTIM
from pivotflow.worker.group_adam import GroupAdam
from pivotflow.worker.lora import restore

OPTIM_WAIT_S = 30.0  # for the optimizer state to reach this node's store (on a cluster)


def publish_version(store: ParamStore, name: str, version: int,
                    weights: dict[str, torch.Tensor], optim_state: dict[str, torch.Tensor],
                    config: dict) -> list[str]:
    """Publish ``name@version`` and its optimizer state, and collect the older ones; returns the
    names published (the caller waits for them to cross to every node, all at once)."""
    store.publish(f"{name}.optim", version, optim_state, config)
    store.gc(f"{name}.optim", keep=KEEP_OPTIM)
    store.publish(name, version, weights, config)
    store.gc(name, keep=KEEP)
    return [f"{name}.optim", name]


def load_optim_state(store: ParamStore, name: str, version: int) -> dict[str, torch.Tensor]:
    """``<name>.optim`` at ``version``, waiting for it up to ``OPTIM_WAIT_S``."""
    deadline = time.monotonic() + OPTIM_WAIT_S
    while True:
        try:
            return store.load(f"{name}.optim", version)[2]
        except CheckpointError:
            if time.monotonic() > deadline:
                raise WorkerError(f"optimizer state {name}.optim@v{version} never reached the "
                                  "parameter store") from None
            time.sleep(0.01)


def take_over(store: ParamStore, name: str, version: int, model: torch.nn.Module,
              optim: GroupAdam, rank_knob: str, rank: int) -> None:
    """Load ``name@version`` and its optimizer state into ``model`` and ``optim``; under LoRA
    (``rank`` > 0, set by the knob ``rank_knob``) the adapters, and the frozen weights as the
    published ones less the adapters' update. A state without this run's adapters is a
    one-line CheckpointError naming the first."""
    _, _, tensors = store.load(name, version)
    model.load_state_dict(tensors, strict=False)
    state = load_optim_state(store, name, version)
    bad = restore(model, state)
    if bad:
        raise CheckpointError(f"optimizer state {name}.optim@v{version} has no LoRA adapter "
                              f"{bad[0]!r} of this run's shape ({rank_knob} {rank}); "
                              f"{len(bad)} missing or misshaped")
    optim.load_state(state)
