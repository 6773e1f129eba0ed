"""The embedded PyTorch engine: a Qwen2/Llama/Qwen3/Qwen3-MoE decoder, slot KV cache and continuous
batching, in float32, bfloat16 or float16 on CPU or CUDA."""

from __future__ import annotations

from pivotflow.engines.torch.engine import TorchEngine
from pivotflow.engines.torch.hf_config import config_from_hf, config_to_hf, resolve_dtype
from pivotflow.engines.torch.model import Decoder, ModelConfig, token_logprobs
from pivotflow.engines.torch.weights import (
    ModelFolder,
    build_model,
    load_checkpoint,
    load_model_folder,
    save_checkpoint,
)

__all__ = [
    "Decoder",
    "ModelConfig",
    "ModelFolder",
    "TorchEngine",
    "build_model",
    "config_from_hf",
    "config_to_hf",
    "load_checkpoint",
    "load_model_folder",
    "resolve_dtype",
    "save_checkpoint",
    "token_logprobs",
]
