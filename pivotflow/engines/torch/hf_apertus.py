"""Swiss AI's Apertus (``apertus``: 8B, 70B): Llama's layer with q and k normalised per head
before rope, its norms named ``attention_layernorm`` and ``feedforward_layernorm`` (held as
``input_layernorm`` and ``post_attention_layernorm``: ``params.renamed_layout``), and an ungated MLP whose activation,
xIELU, has two learned scalars in each layer (``mlp.act_fn.alpha_p``, ``alpha_n``) beside its
constants ``beta`` and ``eps`` (``feedforward.XIELU``).

ApertusConfig's defaults where a config names none: epsilon 1e-5, and its rope: Llama 3's by 8
from 8192 positions, theta 1.2e7.
"""

from __future__ import annotations

from typing import Any

from pivotflow.engines.torch.hf_families import ENGINE
from pivotflow.errors import ModelConfigError

_DEFAULT_ROPE = {"rope_type": "llama3", "rope_theta": 12000000.0, "factor": 8.0,
                 "original_max_position_embeddings": 8192, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0}


def apertus_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with ApertusConfig's defaults where it names none; raises ModelConfigError
    naming ``where`` for another activation than xIELU."""
    act = raw.get("hidden_act", "xielu")
    if act != "xielu":
        raise ModelConfigError(f"{where}: hidden_act={act!r} {ENGINE} on apertus (xielu)")
    out = {**raw, "rms_norm_eps": raw.get("rms_norm_eps", 1e-5)}
    if not (raw.get("rope_scaling") or raw.get("rope_parameters")):
        out["rope_parameters"] = dict(_DEFAULT_ROPE)
    return out
