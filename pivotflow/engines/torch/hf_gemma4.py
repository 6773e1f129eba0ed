"""Google's Gemma 4 text decoder (``gemma4_text``: gemma-4-31B, and the text model of its
``Gemma4ForConditionalGeneration``): Gemma 3's sandwich layer and tanh-GELU gate, per-head q/k
norms (scaling by their weight, not 1 + weight), unscaled scores, values RMS-normalised
without a scale, each layer's output times a ``layer_scalar``, embeddings times sqrt(hidden).
Its full-attention layers differ from its sliding ones: heads of ``global_head_dim`` (512),
``num_global_key_value_heads`` key/value heads and values equal to keys where
``attention_k_eq_v``, and "proportional" rope (a quarter of the frequencies turning over the
whole head); the sliding ones plain RoPE at 1e4.

gemma-4-E2B and E4B add per-layer inputs (``hidden_size_per_layer_input``: each layer's
embedding of each token, gating a branch after its MLP), key/value sharing (their last
``num_kv_shared_layers`` layers attend over the keys and values of the last earlier layer of
their type) and twice as wide MLPs on those (``use_double_wide_mlp``).

gemma-4-26B-A4B adds, beside each layer's MLP, a routed mixture of experts
(``enable_moe_block``: ``num_experts``, ``top_k_experts`` a token, of
``moe_intermediate_size``): its router reads the layer's unnormalised input, RMS-normalised and
scaled, a softmax over all experts, the top k renormalised and each times its own scale; the
experts read the input through a norm of their own, and the MLP's and the experts' outputs are
each normalised before their sum is (``params/gemma4_layout`` holds the file's router and
stacked experts as the common names).

gemma-4-12B (``Gemma4UnifiedForConditionalGeneration``, text ``gemma4_unified_text``) is the
same text decoder without per-layer inputs or experts: held, served and written as
``gemma4_text`` (``held_config``).

Gemma4TextConfig's defaults where a config names none. What pivotflow does not run is a
one-line error: bidirectional attention over all tokens (``use_bidirectional_attention``
"all", an embedding model's; "vision" concerns image tokens alone and text runs causally).
"""

from __future__ import annotations

from typing import Any

from pivotflow.engines.torch.architectures import GATED_ACTIVATIONS
from pivotflow.engines.torch.hf_families import ENGINE, counts, number
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.errors import ModelConfigError

# Gemma4TextConfig's defaults (its per-layer inputs' and KV sharing's: _PER_LAYER)
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262144, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 30, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True, "sliding_window": 512, "attention_bias": False}
_SLIDING_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
_FULL_ROPE = {"rope_type": "proportional", "partial_rotary_factor": 0.25,
              "rope_theta": 1000000.0}
_GLOBAL_HEAD_DIM = 512  # (Gemma4TextConfig's, where a config names none)
# E2B's and E4B's per-layer inputs and key/value sharing (the config's key, ModelConfig's
# field of the same name; Gemma4TextConfig's default)
_PER_LAYER = (("hidden_size_per_layer_input", 256), ("vocab_size_per_layer_input", 262144),
              ("num_kv_shared_layers", 0))


def gemma4_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with Gemma4TextConfig's defaults where it names none, its layer types filled
    in (five sliding layers of every six, the last layer always full, as transformers forces
    it) and its rope one dict per layer type. Raises ModelConfigError naming ``where`` and the
    key for what the embedded engine does not run."""
    # ("vision": image tokens attend to each other both ways; text is causal, as pivotflow runs
    # it. "all": every token both ways, an embedding model's)
    both_ways = raw.get("use_bidirectional_attention")
    if both_ways not in (None, "vision"):
        raise ModelConfigError(f"{where}: use_bidirectional_attention={both_ways!r} {ENGINE} "
                               "on gemma4_text (null or 'vision': text attends causally)")
    out = {**_DEFAULTS, **raw}
    layers = out["num_hidden_layers"]
    types = out.get("layer_types")
    if isinstance(layers, int) and not isinstance(layers, bool) and layers > 0:
        if not types:
            types = ["sliding_attention" if (i + 1) % 6 else "full_attention"
                     for i in range(layers)]
        if isinstance(types, list) and types:
            types = [*types[:-1], "full_attention"]
        out["layer_types"] = types
    window = out["sliding_window"]
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ModelConfigError(f"{where}: sliding_window={raw.get('sliding_window')!r} is not "
                               "a positive integer (gemma4_text's sliding layers need one)")
    rope = raw.get("rope_parameters") or {"sliding_attention": _SLIDING_ROPE,
                                          "full_attention": _FULL_ROPE}
    if not isinstance(rope, dict) or set(rope) != {"sliding_attention", "full_attention"}:
        raise ModelConfigError(f"{where}: rope_parameters={rope!r} {ENGINE} on gemma4_text "
                               "(one dict for full_attention, one for sliding_attention)")
    full = rope["full_attention"]
    kind = full.get("rope_type", "default") if isinstance(full, dict) else None
    if kind not in ("default", "proportional"):
        raise ModelConfigError(f"{where}: rope_parameters.full_attention={full!r} {ENGINE} on "
                               "gemma4_text (rope_type proportional or default)")
    if kind == "default":  # (transformers turns the whole head there, whatever the share)
        full = {k: v for k, v in full.items() if k != "partial_rotary_factor"}
    return {**out, "rope_parameters": {**rope, "full_attention": full}}


def gemma4_fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """ModelConfig's Gemma 4 fields: its gate, logit soft-capping (null: none), and its full
    layers' heads (``global_head_dim``, or a ``per_layer_config`` as transformers 5.25 writes
    it) and values."""
    act = raw.get("hidden_activation", "gelu_pytorch_tanh")
    if act not in GATED_ACTIVATIONS:
        raise ModelConfigError(f"{where}: hidden_activation={act!r} {ENGINE} "
                               f"({', '.join(GATED_ACTIVATIONS)})")
    out: dict[str, Any] = {"hidden_act": act}
    cap = raw.get("final_logit_softcapping")
    if cap is not None:
        out["final_logit_softcapping"] = number(cap, "final_logit_softcapping", where)
        if out["final_logit_softcapping"] <= 0:
            raise ModelConfigError(f"{where}: final_logit_softcapping={cap!r} is not positive "
                                   "(null: none)")
    k_eq_v = raw.get("attention_k_eq_v", False)
    if not isinstance(k_eq_v, bool):
        raise ModelConfigError(f"{where}: attention_k_eq_v={k_eq_v!r} is not true or false")
    head_dim, kv_heads = _global_heads(raw, where)
    out.update(counts(raw, where, tuple((key, key, default) for key, default in _PER_LAYER)))
    if not out["hidden_size_per_layer_input"]:  # (its table's size means nothing then)
        out["vocab_size_per_layer_input"] = 0
    for key in ("use_double_wide_mlp", "enable_moe_block"):
        if not isinstance(raw.get(key, False), bool):
            raise ModelConfigError(f"{where}: {key}={raw[key]!r} is not true or false")
    wide = raw.get("use_double_wide_mlp", False)
    if raw.get("enable_moe_block", False):  # (26B-A4B's: a renormalised softmax router)
        out.update(counts(raw, where, (("num_experts", "num_experts", None),
                                       ("num_experts_per_tok", "top_k_experts", None),
                                       ("moe_intermediate_size", "moe_intermediate_size", None))),
                   norm_topk_prob=True)
    # (transformers gives the full layers their own key/value heads only with k_eq_v; the
    # double-wide MLPs are the KV-sharing layers')
    return {**out, "attention_k_eq_v": k_eq_v, "global_head_dim": head_dim,
            "num_global_key_value_heads": kv_heads if k_eq_v else 0,
            "use_double_wide_mlp": wide and bool(out["num_kv_shared_layers"])}


def _global_heads(raw: dict[str, Any], where: str) -> tuple[int, int]:
    """(the full layers' head width, their key/value heads or 0) as Gemma4TextConfig reads
    them: a ``per_layer_config`` where one is written (one entry per full layer, all alike),
    else ``global_head_dim`` (512) and ``num_global_key_value_heads`` (none)."""
    per_layer = raw.get("per_layer_config")
    if per_layer is None:
        values = (raw.get("global_head_dim", _GLOBAL_HEAD_DIM),
                  raw.get("num_global_key_value_heads") or 0)
        keys = ("global_head_dim", "num_global_key_value_heads")
    else:
        full = [str(i) for i, t in enumerate(raw["layer_types"]) if t == "full_attention"]
        entries = per_layer if isinstance(per_layer, dict) else {}
        kinds = {_entry_key(entries.get(i)) for i in full}
        if set(entries) != set(full) or len(kinds) != 1:
            raise ModelConfigError(f"{where}: per_layer_config {ENGINE} on gemma4_text (one "
                                   "entry per full_attention layer, all alike)")
        entry = entries[full[0]]
        values = (entry.get("head_dim"), entry.get("num_key_value_heads") or 0)
        keys = ("per_layer_config.head_dim", "per_layer_config.num_key_value_heads")
    for key, value in zip(keys, values, strict=True):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (
                key.endswith("head_dim") and value == 0):
            raise ModelConfigError(f"{where}: {key}={value!r} is not a positive integer")
    return values[0], values[1]


def _entry_key(entry: Any) -> tuple[Any, ...]:
    """A per-layer entry (a dict) as something hashable: its sorted items."""
    return tuple(sorted(entry.items())) if isinstance(entry, dict) else (entry,)


def gemma4_to_hf(cfg: ModelConfig, drop: object) -> dict[str, Any]:
    """Gemma4TextConfig's keys for ``cfg``: the full layers' heads as the Hub's configs name
    them (which transformers and vLLM both read), the features pivotflow does not run off
    (``drop``: hf_config_write's mark for a key to leave out, its ``hidden_act``). Its rope,
    one dict per layer type, is ``hf_windows.windows_to_hf``'s to write, as Gemma 3's."""
    return {"hidden_activation": cfg.hidden_act, "hidden_act": drop,
            "attention_bias": cfg.attention_bias,
            "final_logit_softcapping": cfg.final_logit_softcapping or None,
            "global_head_dim": cfg.global_head_dim or cfg.head_dim,
            "num_global_key_value_heads": cfg.num_global_key_value_heads or None,
            "attention_k_eq_v": cfg.attention_k_eq_v,
            "hidden_size_per_layer_input": cfg.hidden_size_per_layer_input,
            "vocab_size_per_layer_input": cfg.vocab_size_per_layer_input or cfg.vocab_size,
            "num_kv_shared_layers": cfg.num_kv_shared_layers,
            "use_double_wide_mlp": cfg.use_double_wide_mlp,
            "enable_moe_block": cfg.experts_beside_mlp, "num_experts": cfg.num_experts or None,
            "top_k_experts": cfg.num_experts_per_tok or None,
            "moe_intermediate_size": cfg.moe_intermediate_size or None,
            "use_bidirectional_attention": None}


def gemma4_vllm_keys(config: dict[str, Any]) -> dict[str, Any]:
    """A gemma4_text config as vLLM reads it: vLLM builds the experts beside the MLP wherever
    ``num_experts`` is set, transformers only with ``enable_moe_block``; without it, no
    experts for either."""
    if config.get("enable_moe_block"):
        return config
    return {**config, "num_experts": None, "top_k_experts": None}
