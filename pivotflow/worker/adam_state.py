"""AdamW state as named tensors, so it can be broadcast between trainers and kept in the
parameter store while no trainer holds it."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from pivotflow.params.optim_entries import check_entries

_KEYS = ("exp_avg", "exp_avg_sq", "step")


def init_adam_state(model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
    """Create the state AdamW would create on its first step (zeros, step 0), so every trainer
    has the same tensors before any step."""
    for p in model.parameters():
        if p.requires_grad and not optim.state[p]:
            optim.state[p] = {"step": torch.zeros((), dtype=torch.float32),
                              "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                              "exp_avg_sq": torch.zeros_like(p,
                                                             memory_format=torch.preserve_format)}


def adam_tensors(model: torch.nn.Module, optim: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """``{"<param>.<exp_avg|exp_avg_sq|step>": tensor}`` (views, not copies), in parameter
    order."""
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:  # (frozen: LoRA's base weights, which AdamW never steps)
            continue
        state = optim.state[p]
        for key in _KEYS:
            out[f"{name}.{key}"] = state[key]
    return out


def check_adam_tensors(named: list[tuple[str, torch.nn.Parameter]],
                       tensors: Mapping[str, torch.Tensor]) -> None:
    """Raise CheckpointError when ``tensors`` lacks an entry of the trainable weights ``named``
    or has one of the wrong shape (a state saved for another model)."""
    check_entries([n for n, _ in named], [tuple(p.shape) for _, p in named], tensors)


def load_adam_tensors(model: torch.nn.Module, optim: torch.optim.Optimizer,
                      tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy a stored state into ``optim``; raises CheckpointError when an entry is missing or
    has the wrong shape (a state saved for another model)."""
    check_adam_tensors([(n, p) for n, p in model.named_parameters() if p.requires_grad],
                       tensors)
    for name, t in adam_tensors(model, optim).items():
        t.copy_(tensors[name])
