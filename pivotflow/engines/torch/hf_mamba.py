"""Mamba2 layers' keys in a ``config.json`` (Granite 4.0-H's and Nemotron-H's, each under its
own names) as ModelConfig's ``mamba_*`` fields and ``time_step_limit``.
"""

from __future__ import annotations

import math
from typing import Any

from pivotflow.errors import ModelConfigError

NO_LIMIT = (0.0, math.inf)  # (time_step_limit's default: the time step unclamped)
_BOOLS = ("mamba_conv_bias", "mamba_proj_bias")


def _int(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelConfigError(f"{where}: {key}={value!r} is not an integer >= 1")
    return value


def mamba_fields(raw: dict[str, Any], keys: dict[str, tuple[str, Any]],
                 where: str) -> dict[str, Any]:
    """ModelConfig's Mamba2 fields from ``raw``, ``keys`` giving each field's key in this
    family's config and its default there; a head width "auto" (Granite's) is the inner width
    ``mamba_expand * hidden_size`` over the heads."""
    out: dict[str, Any] = {}
    for field, (key, default) in keys.items():
        value = raw.get(key, default)
        if field in _BOOLS:
            if not isinstance(value, bool):
                raise ModelConfigError(f"{where}: {key}={value!r} is not true or false")
            out[field] = value
        elif field != "mamba_d_head":
            out[field] = _int(value, key, where)
    key, default = keys["mamba_d_head"]
    head = raw.get(key, default)
    if head == "auto" or head is None:  # (GraniteMoeHybridConfig's: the inner width's share)
        inner = out["mamba_expand"] * raw["hidden_size"]
        if inner % out["mamba_n_heads"]:
            raise ModelConfigError(f"{where}: {keys['mamba_n_heads'][0]}="
                                   f"{out['mamba_n_heads']} does not divide mamba_expand * "
                                   f"hidden_size ({inner})")
        head = inner // out["mamba_n_heads"]
    out["mamba_d_head"] = _int(head, key, where)
    out["time_step_limit"] = time_step_limit(raw.get("time_step_limit", NO_LIMIT), where)
    return out


def time_step_limit(limit: Any, where: str) -> tuple[float, float]:
    """A config's ``time_step_limit`` as (low, high); null, or a missing high (JSON has no
    inf: null, or transformers 5's ``{"__float__": "Infinity"}``), is unlimited."""
    if limit is None:
        limit = NO_LIMIT
    if isinstance(limit, list | tuple):
        limit = [math.inf if v is None else _json_float(v) for v in limit]
    if (not isinstance(limit, list | tuple) or len(limit) != 2
            or any(isinstance(v, bool) or not isinstance(v, int | float) for v in limit)):
        raise ModelConfigError(f"{where}: time_step_limit={limit!r} is not [low, high]")
    return float(limit[0]), float(limit[1])


def _json_float(value: Any) -> Any:
    """transformers 5 writes a float JSON cannot (inf, nan) as ``{"__float__": "Infinity"}``."""
    if isinstance(value, dict) and set(value) == {"__float__"}:
        try:
            return float(value["__float__"])
        except (TypeError, ValueError):
            return value
    return value
