"""Meta's Llama 4 text decoder (``llama4_text``: Llama 4 Scout and Maverick's, the text model of
their ``Llama4ForConditionalGeneration``; pivotflow writes it back as a ``Llama4ForCausalLM``).

Its rope layers (``no_rope_layers`` 1; every fourth layer is NoPE by default) attend within
chunks of ``attention_chunk_size`` positions (a token sees the earlier positions of its own
chunk: held as sliding layers with ``ModelConfig.attention_chunk_size``), rotate interleaved
pairs (held reordered, as Cohere's: ``renamed_layout.turn_heads``), and RMS-normalise q and k
per head without a weight (``use_qk_norm``); its NoPE layers attend to every position, their
queries scaled by 1 + attn_scale * log(1 + floor((p + 1) / floor_scale))
(``attn_temperature_tuning``). Its ``moe_layers`` (every ``interleave_moe_layer_step``-th by
default) route each token to ``num_experts_per_tok`` of ``num_local_experts`` experts of
``intermediate_size`` by a sigmoid of their top logits, each expert reading the token times
its weight, beside a shared expert of the same width every token goes through; its other
layers' MLPs are ``intermediate_size_mlp`` wide (``params/llama4_layout`` holds the file's
router, shared expert and input-major expert stacks under the common names).

Llama4TextConfig's defaults where a config names none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pivotflow.engines.torch.hf_families import number
from pivotflow.engines.torch.hf_windows import nope_layers
from pivotflow.errors import EngineError, ModelConfigError

if TYPE_CHECKING:
    from pivotflow.engines.torch.model_config import ModelConfig

# Llama4TextConfig's defaults
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192,
    "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
    "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "num_experts_per_tok": 1,
    "num_local_experts": 16, "interleave_moe_layer_step": 1, "use_qk_norm": True,
    "no_rope_layer_interval": 4, "attention_chunk_size": 8192, "attn_temperature_tuning": True,
    "floor_scale": 8192, "attn_scale": 0.1, "attention_bias": False}
_THETA = 500000.0  # (Llama4TextConfig's rope base)
_TYPES = ("full_attention", "chunked_attention")


def llama4_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with Llama4TextConfig's defaults where it names none, said as config_from_hf
    reads every family: the dense MLPs' width as ``intermediate_size`` (the experts' as
    ``moe_intermediate_size``), its chunked layers as sliding ones with a window of the chunk.
    Raises ModelConfigError naming ``where`` and the key it cannot read."""
    out = {**_DEFAULTS, **raw}
    if out.get("no_rope_layers") == []:  # (empty: derived, as Llama4TextConfig does)
        out.pop("no_rope_layers")
    out["intermediate_size"], out["moe_intermediate_size"] = (out["intermediate_size_mlp"],
                                                              out["intermediate_size"])
    rope = out.get("rope_parameters") or out.get("rope_scaling")
    if "rope_theta" not in out and not (isinstance(rope, dict) and "rope_theta" in rope):
        out["rope_theta"] = _THETA
    layers = out["num_hidden_layers"]
    if isinstance(layers, bool) or not isinstance(layers, int) or layers <= 0:
        return out  # (config_from_hf names it)
    nope = set(nope_layers(out, layers, where))
    chunk = out["attention_chunk_size"]
    # (as Llama4TextConfig derives them: its rope layers chunk unless the chunk is null)
    types = out.get("layer_types") or ["chunked_attention" if i not in nope and chunk is not None
                                       else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or any(t not in _TYPES
                                                                  for t in types):
        raise ModelConfigError(f"{where}: layer_types={out.get('layer_types')!r} is not a "
                               f"list of {', '.join(_TYPES)}, one for each of {layers} layers")
    chunked = [i for i, t in enumerate(types) if t == "chunked_attention"]
    if chunked and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0):
        raise ModelConfigError(f"{where}: attention_chunk_size={chunk!r} is not a positive "
                               "integer (its layer_types chunk)")
    out["layer_types"] = ["sliding_attention" if t == "chunked_attention" else t
                          for t in types]
    out["sliding_window"] = chunk if chunked else None
    return out


def llama4_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """ModelConfig's Llama 4 fields: its NoPE layers, chunks, query temperature, weightless
    q/k norms and experts (none where ``moe_layers`` names no layer)."""
    out: dict[str, Any] = {"nope_layers": nope_layers(raw, layers, where),
                           "weightless_qk_norm": bool(raw["use_qk_norm"])}
    if raw.get("sliding_window"):
        out["attention_chunk_size"] = raw["sliding_window"]
    if raw["attn_temperature_tuning"]:
        out["attn_scale"] = number(raw["attn_scale"], "attn_scale", where)
        out["floor_scale"] = number(raw["floor_scale"], "floor_scale", where)
    sparse = _moe_layers(raw, layers, where)
    if not sparse:
        return out
    experts, k = raw["num_local_experts"], raw["num_experts_per_tok"]
    for key, value in (("num_local_experts", experts), ("num_experts_per_tok", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelConfigError(f"{where}: {key}={value!r} is not a positive integer")
    return {**out, "num_experts": experts, "num_experts_per_tok": k,
            "moe_intermediate_size": raw["moe_intermediate_size"], "n_shared_experts": 1,
            "scoring_func": "sigmoid", "norm_topk_prob": False,
            "mlp_only_layers": tuple(i for i in range(layers) if i not in sparse)}


def _moe_layers(raw: dict[str, Any], layers: int, where: str) -> set[int]:
    """The layers with experts: ``moe_layers``, else every ``interleave_moe_layer_step``-th
    (from the step's own), as Llama4TextConfig derives them."""
    named = raw.get("moe_layers")
    if named is None:
        step = raw["interleave_moe_layer_step"]
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ModelConfigError(f"{where}: interleave_moe_layer_step={step!r} is not a "
                                   "non-negative integer")
        return set(range(step - 1, layers, step)) if step else set()
    if not isinstance(named, list) or any(isinstance(i, bool) or not isinstance(i, int)
                                          or not 0 <= i < layers for i in named):
        raise ModelConfigError(f"{where}: moe_layers={named!r} is not a list of layer "
                               f"numbers below {layers}")
    return set(named)


def llama4_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """Llama4TextConfig's keys for ``cfg``. Raises ModelConfigError for what the family
    cannot say: chunks on other layers than its rope ones, another router or shared expert."""
    n = cfg.num_hidden_layers
    rope_layers = {i for i in range(n) if i not in cfg.nope_layers}
    if cfg.sliding_layers and (set(cfg.sliding_layers) != rope_layers
                               or not cfg.attention_chunk_size):
        raise ModelConfigError("a llama4_text checkpoint attends within chunks on its rope "
                               "layers alone")
    sparse = [i for i in range(n) if cfg.is_sparse(i)]
    if sparse and (cfg.scoring_func != "sigmoid" or cfg.norm_topk_prob or cfg.n_shared_experts
                   != 1 or cfg.shared_intermediate_size or cfg.routed_scaling_factor != 1.0):
        raise ModelConfigError("a llama4_text checkpoint's experts are weighed by a sigmoid, "
                               "unnormalised, beside one shared expert of their width")
    floor = int(cfg.floor_scale) if cfg.floor_scale.is_integer() else cfg.floor_scale
    step = _step(sparse, n)
    return {
        "intermediate_size": cfg.moe_intermediate_size if sparse else cfg.intermediate_size,
        "intermediate_size_mlp": cfg.intermediate_size,
        "num_local_experts": cfg.num_experts if sparse else 1,
        "num_experts_per_tok": cfg.num_experts_per_tok if sparse else 1,
        "moe_layers": sparse, "interleave_moe_layer_step": step,
        "no_rope_layers": [int(i in rope_layers) for i in range(n)],
        "attention_chunk_size": cfg.attention_chunk_size or None,
        "layer_types": ["chunked_attention" if cfg.is_sliding(i) else "full_attention"
                        for i in range(n)],
        "use_qk_norm": cfg.weightless_qk_norm, "attn_temperature_tuning": bool(cfg.attn_scale),
        "attn_scale": cfg.attn_scale or _DEFAULTS["attn_scale"], "floor_scale": floor,
        "attention_bias": cfg.attention_bias, "output_router_logits": False,
        "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}


def _step(sparse: list[int], layers: int) -> int:
    """The ``interleave_moe_layer_step`` whose pattern is ``sparse`` (what vLLM reads), or 0
    where none is (``llama4_vllm_kwargs`` refuses it then)."""
    if not sparse:
        return 0
    step = sparse[0] + 1
    return step if sparse == list(range(step - 1, layers, step)) else 0


def llama4_vllm_kwargs(raw: dict[str, Any], where: str, on_cpu: bool) -> dict[str, Any]:
    """``vllm.LLM`` arguments that make vLLM 0.32 run a llama4_text config (or its wrapper's
    text model) as transformers does: its query temperature on or off as the config says
    (vLLM's own default is on only past 32K positions, whatever the config says), and on CPU
    a KV block size that divides its chunk (vLLM's CPU blocks are 128 positions, multiples
    of 32, and its chunks must be whole blocks). Raises EngineError naming ``where`` for
    sparse layers vLLM would place elsewhere (it reads ``interleave_moe_layer_step``
    alone)."""
    text = raw.get("text_config") if raw.get("model_type") == "llama4" else raw
    if not isinstance(text, dict) or text.get("model_type") != "llama4_text":
        return {}
    from pivotflow.engines.torch.hf_config import config_from_hf

    cfg = config_from_hf(text, where)
    sparse = [i for i in range(cfg.num_hidden_layers) if cfg.is_sparse(i)]
    if sparse and not _step(sparse, cfg.num_hidden_layers):
        raise EngineError(f"{where}: moe_layers {sparse} are not every Nth layer, which vLLM "
                          "0.32's llama4 reads (interleave_moe_layer_step)")
    kw: dict[str, Any] = {"override_generation_config": {
        "attn_temperature_tuning": bool(cfg.attn_scale)}}
    chunk = cfg.attention_chunk_size
    if on_cpu and chunk:
        block = next((b for b in (128, 64, 32) if chunk % b == 0), 0)
        if not block:
            raise EngineError(f"{where}: attention_chunk_size {chunk} is not a multiple of 32, "
                              "which vLLM 0.32's CPU blocks need")
        kw["block_size"] = block
    return kw
