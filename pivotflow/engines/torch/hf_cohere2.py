"""Cohere's Command R7B and Command A (``cohere2``): a parallel layer (attention and the MLP
read one LayerNorm'd input, both added to the residual), LayerNorms without a bias
(``layer_norm_eps``), heads of hidden_size / num_attention_heads whatever ``head_dim`` says
(as transformers), rope in interleaved pairs (held reordered: ``renamed_layout.turn_heads``,
as ERNIE 4.5's) on the sliding layers alone, the full ones turning no position, and logits
times ``logit_scale``. Cohere2Config's defaults where a config names none: three sliding layers
of every four (``sliding_window_pattern``), a window of 4096, tied embeddings.

Command R (``cohere``, Cohere 1) is the same layer with rope on every layer and no window;
Command R+ adds LayerNorms of q and k per head, each head with a weight of its own
(``use_qk_norm``; held in the turned order as the q/k rows are).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pivotflow.engines.torch.hf_families import ENGINE, number
from pivotflow.errors import ModelConfigError

if TYPE_CHECKING:
    from pivotflow.engines.torch.model_config import ModelConfig

# Cohere2Config's defaults (CohereConfig's the same, but for the window it has not)
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528,
    "num_hidden_layers": 40, "num_attention_heads": 64, "max_position_embeddings": 8192,
    "tie_word_embeddings": True, "sliding_window": 4096, "attention_bias": False}


def cohere2_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with Cohere2Config's defaults where it names none, its norms' epsilon under
    the common key, head_dim derived as transformers derives it, its layer types filled in.
    Raises ModelConfigError naming ``where`` for a config without a window (transformers then
    turns no position anywhere) or a cohere2 one with q/k norms (Command R+'s, not this
    family's)."""
    kind = raw.get("model_type")
    out = {**_DEFAULTS, **raw, "rms_norm_eps": raw.get("layer_norm_eps", 1e-5)}
    if raw.get("use_qk_norm") and kind == "cohere2":
        raise ModelConfigError(f"{where}: use_qk_norm={raw['use_qk_norm']!r} {ENGINE} on {kind} "
                               "(false: its q/k norms have weights per head)")
    heads, hidden = out["num_attention_heads"], out["hidden_size"]
    if kind == "cohere":  # (no window, rope everywhere; head_dim read as every family's)
        out.pop("sliding_window")
        return out
    window = out["sliding_window"]
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ModelConfigError(f"{where}: sliding_window={raw.get('sliding_window')!r} {ENGINE} "
                               "on cohere2 (a positive window: rope turns on its layers alone)")
    if isinstance(heads, int) and isinstance(hidden, int) and heads > 0:
        out["head_dim"] = hidden // heads
    layers = out["num_hidden_layers"]
    if not out.get("layer_types") and isinstance(layers, int):
        every = out.get("sliding_window_pattern", 4)
        if isinstance(every, bool) or not isinstance(every, int) or every <= 0:
            raise ModelConfigError(f"{where}: sliding_window_pattern={every!r} is not a positive "
                                   "integer")
        out["layer_types"] = ["sliding_attention" if (i + 1) % every else "full_attention"
                              for i in range(layers)]
    return out


def cohere2_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """ModelConfig's Cohere fields: its logit scale (as a divisor), Cohere 2's full layers
    NoPE."""
    scale = number(raw.get("logit_scale", 0.0625), "logit_scale", where)
    if not scale > 0:
        raise ModelConfigError(f"{where}: logit_scale={scale!r} is not positive")
    if raw.get("model_type") == "cohere":  # (Command R+'s q/k norms)
        return {"logits_scaling": 1.0 / scale, "qk_norm": bool(raw.get("use_qk_norm"))}
    full = [i for i, t in enumerate(raw["layer_types"]) if t == "full_attention"]
    return {"nope_layers": tuple(full), "logits_scaling": 1.0 / scale}


def cohere2_to_hf(cfg: ModelConfig, drop: object) -> dict[str, Any]:
    """Cohere2Config's keys for ``cfg`` (``drop``: hf_config_write's mark for a key to leave
    out: its epsilon's other name). Raises ModelConfigError where its NoPE layers are not
    exactly its full ones, which the family cannot say."""
    full = {i for i in range(cfg.num_hidden_layers) if not cfg.is_sliding(i)}
    cohere2 = cfg.architecture == "cohere2"
    if set(cfg.nope_layers) != (full if cohere2 else set()) or (
            cfg.sliding_layers and not cohere2):
        raise ModelConfigError(f"a {cfg.architecture} checkpoint turns rope on its sliding "
                               "layers alone (cohere2) or on every layer, with no window "
                               "(cohere)")
    return {"layer_norm_eps": cfg.rms_norm_eps, "rms_norm_eps": drop,
            "logit_scale": 1.0 / cfg.logits_scaling, "attention_bias": cfg.attention_bias,
            "use_qk_norm": bool(cfg.qk_norm), "pad_token_id": None, "bos_token_id": None,
            "eos_token_id": None}


def cohere2_vllm_overrides(raw: dict[str, Any]) -> dict[str, Any]:
    """What vLLM 0.32 is told of a cohere2 config: its window one narrower. vLLM's Cohere 2
    lets a sliding layer's token see ``sliding_window`` + 1 positions (its reading of Cohere's
    training); transformers, whose reading pivotflow's trainer follows, ``sliding_window``
    (itself included): told one less, vLLM attends where they do (measured: greedy tokens
    parted past the window without it)."""
    window = raw.get("sliding_window", _DEFAULTS["sliding_window"])
    return {"sliding_window": window - 1} if isinstance(window, int) and window > 1 else {}
