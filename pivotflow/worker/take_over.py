"""How a trainer takes over a model it did not train last: the weights and the AdamW state rank
0 published with them, waiting for the state a while (on a cluster it may still be crossing to
this node's store), and under LoRA the adapters out of that state with their update taken back
out of the published, merged weights. The policy's trainer and the critic's share it."""

from __future__ import annotations

import time

import torch

from pivotflow.errors import CheckpointError, WorkerError
from pivotflow.params.base import ParamStore
from pivotflow.worker.adam_state import load_adam_tensors
from pivotflow.worker.lora import restore

OPTIM_WAIT_S = 30.0  # for the optimizer state to reach this node's store (on a cluster)


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
              optim: torch.optim.Optimizer, rank_knob: str, rank: int) -> None:
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
    load_adam_tensors(model, optim, state)
