"""The trainers' AdamW over their data-parallel group, in one of two layouts (``zero_stage``):

* 0, ``ReplicatedAdamW``: every trainer holds AdamW's whole state; the gradients are all-reduced
  and every trainer steps every weight (DDP's layout);
* 1, ``ShardedAdamW`` (``sharded_adam.py``): each trainer holds 1/world of the state, steps only
  its part of the weights and all-gathers the rest (DeepSpeed's ZeRO stage 1).

Both give the same step. Rank 0 of the replicated layout publishes the state whole
(``<model>.optim``: one entry a weight, its name the weight's, ``adam_state.adam_tensors``),
each rank of the sharded one its chunks (``params/optim_entries.py``), and either layout reads
what either stored: ``load_optim_state`` joins the chunks into the same entries (checkpoints
hold those), and a sharded rank reads its own chunks of either. So a run can change the knob
between a checkpoint and its ``--resume``.

The interface the policy's trainer and the critic's use:

* ``zero_grad()``, ``set_lr(lr)``;
* ``step(group, max_grad_norm)``: sum the ranks' gradients, clip by the global norm, step;
  returns the norm before clipping;
* ``state_part(group)``: what this rank publishes of the state with each version (None: nothing;
  a ``StatePart`` whose ``shard`` is None: the whole state);
* ``take_over(copy)``: rank 0 takes over the state the store holds at ``copy`` (before
  ``regroup``; the sharded layout reads it there, each rank its own chunks);
* ``regroup(group, formed, stored)``: at the start of each step, after the group is joined:
  bring every rank's state to the group's (``formed``: a new group was formed; ``stored``:
  where the state the pool published with the weights this trainer holds is, version 0 when
  no step was ever taken).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import torch

from pivotflow.params.base import ParamStore
from pivotflow.params.optim_entries import load_optim_state
from pivotflow.worker.adam_state import adam_tensors, init_adam_state, load_adam_tensors
from pivotflow.worker.train_group import TrainGroup

BETAS = (0.9, 0.99)

class StoreCopy(NamedTuple):
    """Where the pool's state for the weights a trainer holds is: ``model``'s at ``version`` in
    ``store`` (version 0: no step was ever taken, so there is none)."""

    store: ParamStore | None
    model: str
    version: int


NO_STATE = StoreCopy(None, "", 0)


class StatePart(NamedTuple):
    """One rank's part of the state for the store: the whole state (``shard`` None) or its
    shard, ``shard`` the layout ``optim_entries`` joins shards by."""

    tensors: dict[str, torch.Tensor]
    shard: dict[str, Any] | None


class GroupAdam(Protocol):
    """What the trainers call on either layout (see the module)."""

    def set_lr(self, lr: float) -> None: ...

    def zero_grad(self) -> None: ...

    def step(self, group: TrainGroup, max_grad_norm: float) -> float: ...

    def state_part(self, group: TrainGroup) -> StatePart | None: ...

    def take_over(self, copy: StoreCopy) -> None: ...

    def regroup(self, group: TrainGroup, formed: bool, stored: StoreCopy) -> None: ...

    def state_bytes(self) -> int: ...


class ReplicatedAdamW:
    """AdamW's whole state on every rank: the group's gradients are all-reduced, then every rank
    takes the same step."""

    def __init__(self, model: torch.nn.Module, lr: float) -> None:
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optim = torch.optim.AdamW(self.params, lr=lr, betas=BETAS, weight_decay=0.0)
        init_adam_state(model, self.optim)  # same tensors on every rank, for broadcasts

    def set_lr(self, lr: float) -> None:
        for group in self.optim.param_groups:
            group["lr"] = lr

    def zero_grad(self) -> None:
        self.optim.zero_grad(set_to_none=True)

    def step(self, group: TrainGroup, max_grad_norm: float) -> float:
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        group.all_reduce_sum([p.grad for p in self.params if p.grad is not None])
        norm = torch.nn.utils.clip_grad_norm_(self.params, max_grad_norm)
        self.optim.step()
        return float(norm)

    def state_part(self, group: TrainGroup) -> StatePart | None:
        """Rank 0's whole state (every rank holds the same)."""
        return StatePart(adam_tensors(self.model, self.optim), None) if group.rank == 0 else None

    def take_over(self, copy: StoreCopy) -> None:
        assert copy.store is not None
        load_adam_tensors(self.model, self.optim,
                          load_optim_state(copy.store, copy.model, copy.version))

    def regroup(self, group: TrainGroup, formed: bool, stored: StoreCopy) -> None:
        if formed:  # rank 0's state is the group's: a trainer that just joined takes it
            group.broadcast(list(adam_tensors(self.model, self.optim).values()))

    def state_bytes(self) -> int:
        """What this rank holds of AdamW's state."""
        return sum(t.numel() * t.element_size()
                   for t in adam_tensors(self.model, self.optim).values())


def group_adam(model: torch.nn.Module, lr: float, zero_stage: int) -> GroupAdam:
    """The optimizer of ``model``'s trainable weights for ``zero_stage`` (see the module)."""
    if zero_stage == 1:
        from pivotflow.worker.sharded_adam import ShardedAdamW

        return ShardedAdamW(model, lr)
    return ReplicatedAdamW(model, lr)
