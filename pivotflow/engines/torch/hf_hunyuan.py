"""Tencent Hunyuan's dense models (``hunyuan_v1_dense``: Hunyuan-0.5B to 7B): Llama's layer with
q and k normalised per head *after* rope (``ModelConfig.qk_norm_after_rope``; its files name the
norms ``query_layernorm``/``key_layernorm``, held as q_norm/k_norm) and its own rope scaling.

Its configs say the rope ``{"type": "dynamic", "alpha": A, ...}``: NTK scaling by a fixed alpha,
which transformers reads as a stretched base, ``theta * A ** (d / (d - 2))`` for heads of d, the
same at every length (its ``ntk_alpha``): pivotflow holds that base as plain rope's theta, which
computes the same frequencies. ``dynamic`` without an alpha scales by the sequence's length and
is refused (rope_fields names it), as are cross-layer attention (``use_cla``: layers sharing
another's keys and values) and no rope at all (``use_rotary_pos_emb`` false).
"""

from __future__ import annotations

from typing import Any

from pivotflow.engines.torch.hf_families import ENGINE, number
from pivotflow.errors import ModelConfigError


def hunyuan_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with HunYuanDenseV1Config's norm epsilon (1e-5), and its alpha rope said as
    plain rope with the base it stretches to. Raises ModelConfigError naming ``where`` and the
    key for what the embedded engine does not run."""
    for key, runs in (("use_cla", False), ("use_rotary_pos_emb", True)):
        if key in raw and bool(raw[key]) != runs:
            raise ModelConfigError(f"{where}: {key}={raw[key]!r} {ENGINE} on hunyuan_v1_dense "
                                   f"({str(runs).lower()})")
    out = {**raw, "rms_norm_eps": raw.get("rms_norm_eps", 1e-5)}
    key = "rope_scaling" if raw.get("rope_scaling") else "rope_parameters"
    rope = raw.get(key)
    if not isinstance(rope, dict) or rope.get("alpha") is None or rope.get(
            "rope_type", rope.get("type")) != "dynamic":
        return out
    heads = raw.get("num_attention_heads") or 1
    dim = raw.get("head_dim") or (raw.get("hidden_size") or 0) // heads
    if not isinstance(dim, int) or dim <= 2:
        raise ModelConfigError(f"{where}: head_dim={dim!r} is too narrow for {key}.alpha")
    alpha = number(rope["alpha"], f"{key}.alpha", where)
    theta = number(rope.get("rope_theta", raw.get("rope_theta", 10000.0)), "rope_theta", where)
    out[key] = {"rope_type": "default", "rope_theta": theta * alpha ** (dim / (dim - 2))}
    return out
