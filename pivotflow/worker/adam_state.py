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


def check_adam_tensors(named: list[tuple[str, torch.nn.Parameter]],
                       tensors: dict[str, torch.Tensor]) -> None:
    """Raise CheckpointError when ``tensors`` lacks an entry of the trainable weights ``named``
    or has one of the wrong shape (a state saved for another model)."""
    for name, p in named:
        for key in _KEYS:
            src = tensors.get(f"{name}.{key}")
            want = () if key == "step" else tuple(p.shape)
            if src is None or tuple(src.shape) != want:
                raise CheckpointError(f"optimizer state entry {f'{name}.{key}'!r} is missing or has "
                                      f"shape {None if src is None else tuple(src.shape)}, not "
                                      f"{want}")


def load_adam_tensors(model: torch.nn.Module, optim: torch.optim.Optimizer,
                      tensors: dict[str, torch.Tensor]) -> None:
    """Copy a stored state into ``optim``; raises CheckpointError when an entry is missing or
    has the wrong shape (a state saved for another model)."""
    check_adam_tensors([(n, p) for n, p in model.named_parameters() if p.requires_grad],
                       tensors)
    for name, t in adam_tensors(model, optim).items():
        t.copy_(tensors[name])
