"""The trainers' AdamW over their data-parallel group, in one of two layouts (``zero_stage``):

* 0, ``ReplicatedAdamW``: every trainer holds AdamW's whole state; the gradients are all-reduced
  and every trainer steps every weight (DDP's layout);
* 1, ``ShardedAdamW`` (``sharded_adam.py``): each trainer holds 1/world of the state, steps only
  its part of the weights and all-gathers the rest (DeepSpeed's ZeRO stage 1).

Both give the same step, publish the same ``<model>.optim`` (one entry a weight, its name the
weight's: ``adam_state.adam_tensors``), and take it over from the parameter store the same way,
so a run can change the knob between a checkpoint and its ``--resume``.

The interface the policy's trainer and the critic's use:

* ``zero_grad()``, ``set_lr(lr)``;
* ``step(group, max_grad_norm)``: sum the ranks' gradients, clip by the global norm, step;
  returns the norm before clipping;
* ``state(group)``: the whole state under its names on rank 0 ({} elsewhere); a collective:
  every rank calls it;
* ``load_state(tensors)``: rank 0 takes a stored state over (before ``regroup``);
* ``regroup(group, formed, stored)``: at the start of each step, after the group is joined:
  bring every rank's state to the group's (``formed``: a new group was formed; ``stored()``
  returns the state the pool published with the weights this trainer holds, or None when no
  step was ever taken).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from pivotflow.worker.adam_state import adam_tensors, init_adam_state, load_adam_tensors
from pivotflow.worker.train_group import TrainGroup

BETAS = (0.9, 0.99)

StoredState = Callable[[], "dict[str, torch.Tensor] | None"]


class GroupAdam(Protocol):
    """What the trainers call on either layout (see the module)."""

    def set_lr(self, lr: float) -> None: ...

    def zero_grad(self) -> None: ...

    def step(self, group: TrainGroup, max_grad_norm: float) -> float: ...

    def state(self, group: TrainGroup) -> dict[str, torch.Tensor]: ...

    def load_state(self, tensors: dict[str, torch.Tensor]) -> None: ...

    def regroup(self, group: TrainGroup, formed: bool, stored: StoredState) -> None: ...

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

    def state(self, group: TrainGroup) -> dict[str, torch.Tensor]:
        return adam_tensors(self.model, self.optim) if group.rank == 0 else {}

    def load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        load_adam_tensors(self.model, self.optim, tensors)

    def regroup(self, group: TrainGroup, formed: bool, stored: StoredState) -> None:
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
