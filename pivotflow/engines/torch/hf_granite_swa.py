"""IBM's Granite SWA (``granite_swa``): Granite's layer and multipliers, a learned attention
sink per head (gpt-oss's: a logit every query's softmax also spreads over), a sliding window
on the layers ``layer_types`` says (else all but every fourth, from the first), and a rope
base per layer (``layer_rope_theta``; 0: that layer turns no position).

pivotflow holds at most two bases: one for the full layers and one for the sliding ones
(``sliding_rope_theta``, plain rope), a zero base a NoPE layer; another pattern is a one-line
error, as is a second base with a scaled rope (transformers scales every base alike, and
pivotflow's sliding layers' rope is plain). GraniteSWAConfig's defaults where a config names
none: epsilon 1e-5, a window of 128, tied embeddings.
"""

from __future__ import annotations

from typing import Any

from pivotflow.engines.torch.hf_families import ENGINE, number
from pivotflow.engines.torch.hf_rope import rope_key
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.errors import ModelConfigError


def granite_swa_sliding(types: list[str], layers: int) -> list[int]:
    """The layers that slide: ``layer_types``', else all but every fourth from the first."""
    if types:
        return [i for i, t in enumerate(types) if t == "sliding_attention"]
    return [i for i in range(layers) if i % 4]


def _bases(raw: dict[str, Any], where: str) -> tuple[float | None, float | None, tuple[int, ...]]:
    """(the full layers' base, the sliding layers', the NoPE layers) ``layer_rope_theta``
    says; (None, None, ()) without one. Raises ModelConfigError naming ``where`` for a
    pattern pivotflow cannot hold."""
    thetas, layers = raw.get("layer_rope_theta"), raw.get("num_hidden_layers")
    if thetas is None:
        return None, None, ()
    if not isinstance(thetas, list) or len(thetas) != layers:
        raise ModelConfigError(f"{where}: layer_rope_theta={thetas!r} is not a base for each "
                               f"of the {layers} layers")
    thetas = [number(t, "layer_rope_theta", where) for t in thetas]
    sliding = set(granite_swa_sliding(raw.get("layer_types") or [], len(thetas)))
    full_bases = {t for i, t in enumerate(thetas) if t and i not in sliding}
    sliding_bases = {t for i, t in enumerate(thetas) if t and i in sliding}
    if len(full_bases) > 1 or len(sliding_bases) > 1:
        raise ModelConfigError(f"{where}: layer_rope_theta={thetas!r} {ENGINE} (one base for "
                               "the full layers, one for the sliding ones, 0 for NoPE)")
    nope = tuple(i for i, t in enumerate(thetas) if not t)
    return (next(iter(full_bases), None), next(iter(sliding_bases), None), nope)


def granite_swa_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with GraniteSWAConfig's defaults where it names none, its rope's base the full
    layers' (else the sliding layers') of ``layer_rope_theta``."""
    out = {"rms_norm_eps": 1e-5, "sliding_window": 128, "tie_word_embeddings": True, **raw}
    full, sliding, _ = _bases(raw, where)
    base = full if full is not None else sliding
    if base is None:
        return out
    key = rope_key(raw)
    return {**out, key: {**(raw.get(key) or {}), "rope_theta": base}, "rope_theta": base}


def granite_swa_fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """ModelConfig's NoPE layers and sliding layers' base for a granite_swa config's
    ``layer_rope_theta``, and Granite's multipliers (``granite``). Raises ModelConfigError
    naming ``where`` for a second base with a scaled rope (pivotflow's sliding layers' rope is
    plain; transformers scales every base)."""
    full, sliding, nope = _bases(raw, where)
    out: dict[str, Any] = {"nope_layers": nope}
    if full is not None and sliding is not None and full != sliding:
        key = rope_key(raw)
        rope = raw.get(key) or {}
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            raise ModelConfigError(f"{where}: layer_rope_theta with two bases and {key} "
                                   f"{kind!r} {ENGINE} (plain rope on the sliding layers)")
        out["sliding_rope_theta"] = sliding
    return out


def granite_swa_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """GraniteSWAConfig's per-layer bases for ``cfg`` (its windows: ``hf_windows``)."""
    return {"layer_rope_theta": [
        0 if i in cfg.nope_layers else cfg.sliding_rope_theta
        if cfg.is_sliding(i) and cfg.sliding_rope_theta else cfg.rope_theta
        for i in range(cfg.num_hidden_layers)]}
