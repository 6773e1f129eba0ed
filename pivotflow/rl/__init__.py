"""RL math: group-relative advantages, policy-gradient and value losses (pure tensor functions).

The names below are loaded on first use (module ``__getattr__``), not when the package is
imported: graph files and the controller import ``pivotflow.rl.group_fns`` and
``pivotflow.rl.list_math``, which need no torch, and importing this package must not cost them
the seconds torch takes to import. ``from pivotflow.rl import policy_loss`` works as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pivotflow.rl.advantages import grpo_advantages, rloo_advantages
    from pivotflow.rl.losses import (
        Aggregation,
        KLEstimator,
        kl_penalty,
        masked_mean,
        masked_sum,
        policy_loss,
        value_loss,
    )

# public name -> the submodule that defines it
_HOME = {
    "Aggregation": "losses",
    "KLEstimator": "losses",
    "grpo_advantages": "advantages",
    "kl_penalty": "losses",
    "masked_mean": "losses",
    "masked_sum": "losses",
    "policy_loss": "losses",
    "rloo_advantages": "advantages",
    "value_loss": "losses",
}

__all__ = [
    "Aggregation",
    "KLEstimator",
    "grpo_advantages",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "policy_loss",
    "rloo_advantages",
    "value_loss",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
