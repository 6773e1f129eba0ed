"""AdamW state as named tensors, so it can be broadcast between trainers and kept in the
parameter store while no trainer holds it."""

from __future__ import annotations

import torch

from pivotflow.errors import CheckpointError

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


def load_adam_tensors(model: torch.nn.Module, optim: torch.optim.Optimizer,
                      tensors: dict[str, torch.Tensor]) -> None:
    """Copy a stored state into ``optim``; raises CheckpointError when an entry is missing or
    has the wrong shape (a state saved for another model)."""
    for name, t in adam_tensors(model, optim).items():
        src = tensors.get(name)
        if src is None or src.shape != t.shape:
            raise CheckpointError(f"optimizer state entry {name!r} is missing or has shape "
                                  f"{None if src is None else tuple(src.shape)}, not "
                                  f"{tuple(t.shape)}")
        t.copy_(src)
