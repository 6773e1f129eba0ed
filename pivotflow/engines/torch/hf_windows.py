"""Which layers attend within a sliding window, as transformers reads each family's
``config.json``, and back: ``ModelConfig.sliding_layers``, ``sliding_window`` and
``sliding_rope_theta`` (``hf_config`` calls these).

Each family says it its own way, and transformers' reading is the reference:

* ``mistral``: every layer, whenever ``sliding_window`` is set (absent: 4096; null: none).
* ``phi3``, ``mixtral``: every layer, whenever ``sliding_window`` is set (absent or null:
  none).
* ``qwen2``, ``qwen3``: only with ``use_sliding_window``; then the layers ``layer_types``
  marks ``sliding_attention``, or without it those at ``max_window_layers`` (28) and above.
* ``qwen3_moe``: every layer, with ``use_sliding_window``.
* ``qwen2_moe``: with ``use_sliding_window``, ``layer_types``, else every other layer (the
  first, third...) below ``max_window_layers``.
* ``olmo3``: ``layer_types``, else three sliding layers of every four (the fourth full);
  its ``rope_parameters`` may be one dict per layer type, and its sliding layers take plain
  RoPE (YaRN, where set, is for the full layers only).
* ``gemma2``, ``gpt_oss``: ``layer_types``, else every other layer (the first, third...), one
  rope for all (gpt-oss's window: 128 where the config names none).
* ``gemma3_text``: ``layer_types``, else ``sliding_window_pattern`` - 1 sliding layers of every
  ``sliding_window_pattern`` (6); its sliding layers take plain RoPE at
  ``rope_local_base_freq`` (10000), its full ones ``rope_theta`` (1e6) with any scaling.
* ``gemma4_text``: ``layer_types`` (``hf_gemma4`` fills them in: five sliding of every six, the
  last layer full), its two ropes always one dict per layer type.
* ``smollm3``: ``layer_types``, else, with ``use_sliding_window``, its NoPE layers.
* ``llama4_text``: its chunked layers (``hf_llama4`` says them as sliding ones, the chunk as
  the window; ``ModelConfig.attention_chunk_size`` marks them chunks).
* ``llama``, ``olmo2``, ``glm4``, ``glm4_moe``, ``granite``: none (transformers reads no window for them).

SmolLM3's NoPE layers (``nope_layers``: ``no_rope_layers`` 0, else every
``no_rope_layer_interval``-th, 4) are per-layer too, and read here.
"""

from __future__ import annotations

from typing import Any

from pivotflow.engines.torch.architectures import HYBRID_ARCHITECTURES, MAMBA_ARCHITECTURES
from pivotflow.errors import ModelConfigError

MISTRAL_DEFAULT_WINDOW = 4096  # transformers' MistralConfig, when config.json names none
DEFAULT_WINDOW = 4096  # Qwen2/Qwen3/OLMo-3's
QWEN_MAX_WINDOW_LAYERS = 28  # transformers' default: layers from here on slide
LAYER_TYPES = ("full_attention", "sliding_attention")
_ENGINE = "is not supported by the embedded engine"


def window_fields(raw: dict[str, Any], kind: str, layers: int, where: str) -> dict[str, Any]:
    """``sliding_window`` and ``sliding_layers`` for ModelConfig (empty: every layer full)."""
    types = _layer_types(raw, layers, where)
    if kind in ("mistral", "phi3", "mixtral", "ministral3"):
        default = MISTRAL_DEFAULT_WINDOW if kind == "mistral" else None
        window, sliding = raw.get("sliding_window", default), list(range(layers))
    elif kind in ("qwen2", "qwen3", "qwen3_moe", "qwen2_moe"):
        window = raw.get("sliding_window", DEFAULT_WINDOW) if raw.get("use_sliding_window") \
            else None
        if kind == "qwen3_moe":  # (its modeling reads no layer_types: the window is everywhere)
            sliding = list(range(layers))
        elif kind == "qwen2_moe" and not types:  # (every other layer below max_window_layers)
            first = raw.get("max_window_layers", QWEN_MAX_WINDOW_LAYERS)
            sliding = [i for i in range(layers) if (i + 1) % 2 and i < first]
        else:
            first = raw.get("max_window_layers", QWEN_MAX_WINDOW_LAYERS)
            sliding = ([i for i, t in enumerate(types) if t == "sliding_attention"] if types
                       else [i for i in range(layers) if i >= first])
    elif kind == "smollm3":  # (no window unless one is named)
        window = raw.get("sliding_window")
        nope = nope_layers(raw, layers, where)
        sliding = ([i for i, t in enumerate(types) if t == "sliding_attention"] if types
                   else list(nope) if raw.get("use_sliding_window") else [])
    elif kind == "granite_swa":  # (its layer_types, else all but every fourth from the first)
        from pivotflow.engines.torch.hf_granite_swa import granite_swa_sliding

        window, sliding = raw.get("sliding_window", 128), granite_swa_sliding(types, layers)
    elif kind == "afmoe":  # (its layer_types, else all but every Nth)
        from pivotflow.engines.torch.hf_afmoe import afmoe_sliding

        window, sliding = raw.get("sliding_window", 1024), afmoe_sliding(raw, types, layers)
    elif kind == "dots1":  # (its layer_types, else from max_window_layers on)
        from pivotflow.engines.torch.hf_dots import dots_sliding

        window, sliding = raw.get("sliding_window", 4096), dots_sliding(raw, types, layers)
    elif kind == "exaone4":  # (its layer_types, else its pattern: every Nth full, or "LLLG")
        window, sliding = raw.get("sliding_window", 4096), exaone4_sliding(raw, types, layers,
                                                                           where)
    elif kind in ("olmo3", "gemma3_text", "gemma2", "gpt_oss", "gemma4_text", "cohere2",
                  "llama4_text"):  # (Llama 4's chunks: hf_llama4 says them as windows)
        window = raw.get("sliding_window", 128 if kind == "gpt_oss" else DEFAULT_WINDOW)
        every = ({"olmo3": 4, "gemma2": 2, "gpt_oss": 2}.get(kind)
                 or raw.get("sliding_window_pattern", 6))
        sliding = ([i for i, t in enumerate(types) if t == "sliding_attention"] if types
                   else [i for i in range(layers) if (i + 1) % every])
    else:
        return {}
    if window is None:
        return {}
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ModelConfigError(f"{where}: sliding_window={window!r} is not a positive integer")
    return {"sliding_window": window, "sliding_layers": tuple(sliding)} if sliding else {}


def exaone4_sliding(raw: dict[str, Any], types: list[str], layers: int,
                    where: str) -> list[int]:
    """EXAONE 4.0's sliding layers: ``layer_types``'; else ``sliding_window_pattern``'s, every
    layer but each Nth (an int, Exaone4Config's 4) or its string's L (local) letters repeated
    ("LLLG"); none without a window."""
    if raw.get("sliding_window", 4096) is None:
        return []
    if types:
        return [i for i, t in enumerate(types) if t == "sliding_attention"]
    pattern = raw.get("sliding_window_pattern", 4)
    if isinstance(pattern, str) and pattern and set(pattern) <= {"L", "G"}:
        return [i for i in range(layers) if pattern[i % len(pattern)] == "L"]
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern <= 0:
        raise ModelConfigError(f"{where}: sliding_window_pattern={pattern!r} is not a positive "
                               "integer or a string of L and G")
    return [i for i in range(layers) if (i + 1) % pattern]


def nope_layers(raw: dict[str, Any], layers: int, where: str) -> tuple[int, ...]:
    """SmolLM3's layers without rope: where ``no_rope_layers`` says 0, else every
    ``no_rope_layer_interval``-th (4), as SmolLM3Config derives them."""
    flags = raw.get("no_rope_layers")
    if flags is None:
        every = raw.get("no_rope_layer_interval", 4)
        if isinstance(every, bool) or not isinstance(every, int) or every <= 0:
            raise ModelConfigError(f"{where}: no_rope_layer_interval={every!r} is not a "
                                   "positive integer")
        return tuple(i for i in range(layers) if (i + 1) % every == 0)
    if not isinstance(flags, list) or len(flags) < layers or any(
            f not in (0, 1) or isinstance(f, bool) for f in flags):
        raise ModelConfigError(f"{where}: no_rope_layers is not a list of 0 and 1, one for "
                               f"each of {layers} layers")
    return tuple(i for i in range(layers) if flags[i] == 0)


def _layer_types(raw: dict[str, Any], layers: int, where: str) -> list[str]:
    types = raw.get("layer_types") or []
    # (Qwen3.5's linear layers, Granite 4.0-H's Mamba2 ones: hf_families reads them)
    hybrid = raw.get("model_type") in HYBRID_ARCHITECTURES + MAMBA_ARCHITECTURES
    known = (*LAYER_TYPES, *(("linear_attention",) if hybrid else ()))
    if not isinstance(types, list) or any(t not in known for t in types):
        raise ModelConfigError(f"{where}: layer_types={types!r} {_ENGINE} "
                               f"({', '.join(known)})")
    if types and len(types) != layers:
        raise ModelConfigError(f"{where}: layer_types has {len(types)} entries for "
                               f"{layers} layers")
    return types


def split_layer_rope(raw: dict[str, Any], kind: str, where: str) -> tuple[dict[str, Any],
                                                                         float | None]:
    """(the config as its full-attention layers read their rope, the sliding layers' plain
    RoPE base or None when they share the full layers' rope). OLMo-3's and Gemma 3's
    ``rope_parameters`` may be ``{"full_attention": {...}, "sliding_attention": {...}}``;
    flat, OLMo-3's sliding layers take plain RoPE at ``rope_theta``, Gemma's at
    ``rope_local_base_freq`` (transformers' conversion)."""
    if kind not in ("olmo3", "gemma3_text", "gemma4_text"):
        return raw, None
    rope = raw.get("rope_parameters")
    if isinstance(rope, dict) and set(rope) & set(LAYER_TYPES):
        full, sliding = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
        if sliding.get("rope_type", sliding.get("type", "default")) != "default":
            raise ModelConfigError(
                f"{where}: rope_parameters.sliding_attention={sliding!r} {_ENGINE} (plain RoPE "
                "on sliding layers)")
        theta = sliding.get("rope_theta", full.get("rope_theta", raw.get("rope_theta", 1e4)))
        return {**raw, "rope_parameters": full}, float(theta)
    plain = rope if isinstance(rope, dict) else {}
    if kind == "gemma3_text":  # (Gemma's defaults: 1e6 for full layers, 1e4 for sliding ones)
        theta = raw.get("rope_theta", plain.get("rope_theta", 1e6))
        return ({**raw, "rope_theta": theta},
                float(raw.get("rope_local_base_freq", 1e4)))  # fmt: skip
    return raw, float(plain.get("rope_theta", raw.get("rope_theta", 1e4)))


def windows_to_hf(cfg: Any, rope: dict[str, Any]) -> dict[str, Any]:
    """The keys that make transformers read ``cfg``'s windows back (``rope``: the full layers'
    ``rope_parameters``). Raises ModelConfigError for a pattern the family cannot say."""
    n, sliding = cfg.num_hidden_layers, set(cfg.sliding_layers)
    kind, everywhere = cfg.architecture, sliding == set(range(n))
    if kind == "llama4_text":  # (its chunks: hf_llama4.llama4_to_hf)
        return {}
    types = ["sliding_attention" if i in sliding else "full_attention" for i in range(n)]
    if kind == "smollm3":  # (layer_types say which; use_sliding_window that they do)
        return {"layer_types": types, "use_sliding_window": bool(sliding),
                "sliding_window": cfg.sliding_window or None}
    if kind in ("olmo3", "gemma3_text", "gemma2", "gpt_oss", "exaone4", "dots1", "afmoe",
                "granite_swa", "gemma4_text", "cohere2"):
        out: dict[str, Any] = {"layer_types": types, "sliding_window": cfg.sliding_window or None}
        if cfg.sliding_rope_theta and kind != "granite_swa":  # (its: layer_rope_theta)
            out["rope_parameters"] = {"full_attention": rope, "sliding_attention": {
                "rope_type": "default", "rope_theta": cfg.sliding_rope_theta}}
        return out
    if not sliding:
        return {}
    unwindowed = ("llama", "olmo2", "glm4", "glm4_moe", "granite")
    if kind in unwindowed or (kind in ("mistral", "phi3", "mixtral", "qwen3_moe", "ministral3")
                              and not everywhere):
        raise ModelConfigError(
            f"a {kind} checkpoint cannot say sliding_layers {sorted(sliding)} of {n} layers "
            f"(mistral, phi3, mixtral and qwen3_moe: all or none; {', '.join(unwindowed)}: "
            "none)")
    out = {"sliding_window": cfg.sliding_window}
    if kind in ("qwen2", "qwen3", "qwen3_moe", "qwen2_moe"):
        out.update(use_sliding_window=True, max_window_layers=min(sliding))
    if kind in ("qwen2", "qwen3", "qwen2_moe"):
        out["layer_types"] = types
    return out
