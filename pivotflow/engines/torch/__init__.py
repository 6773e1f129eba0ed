"""The embedded PyTorch engine: a Qwen2/Llama decoder, slot KV cache and continuous batching."""

from __future__ import annotations

from pivotflow.engines.torch.engine import TorchEngine
from pivotflow.engines.torch.model import Decoder, ModelConfig, token_logprobs
from pivotflow.engines.torch.weights import load_checkpoint, save_checkpoint

__all__ = [
    "Decoder",
    "ModelConfig",
    "TorchEngine",
    "load_checkpoint",
    "save_checkpoint",
    "token_logprobs",
]
