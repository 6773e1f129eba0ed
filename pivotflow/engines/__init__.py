"""Inference engines behind one interface (``base.Engine``): torch (embedded), vLLM, SGLang."""

from __future__ import annotations

from typing import Any

from pivotflow.defaults import ENGINE_KINDS
from pivotflow.engines.base import Engine
from pivotflow.errors import EngineError


def make_engine(kind: str, model_config: Any, **kw: Any) -> Engine:
    """Build an engine of ``kind`` for ``model_config``; ``kw`` go to its constructor.

    The vLLM and SGLang adapters import their library only here (vLLM and SGLang take
    ``model_path``, an HF folder). Raises EngineError for an unknown kind or a backend that is
    not installed.
    """
    if kind == "torch":
        from pivotflow.engines.torch.engine import TorchEngine

        return TorchEngine(model_config, **kw)
    if kind == "vllm":
        from pivotflow.engines.vllm_engine import VllmEngine

        return VllmEngine(model_config, **kw)
    if kind == "sglang":
        from pivotflow.engines.sglang_engine import SglangEngine

        return SglangEngine(model_config, **kw)
    if kind == "echo":  # no model: for measuring the control plane (bench/controller.py)
        from pivotflow.engines.echo import EchoEngine

        return EchoEngine(model_config, **kw)
    raise EngineError(f"unknown engine kind {kind!r}; valid kinds: {', '.join(ENGINE_KINDS)}")


def load_version(engine: Engine, store: Any, model: str, version: int | None = None) -> int:
    """Load ``model@version`` (the latest when None) from ``store`` into ``engine``; returns the
    version. An engine that reads the store in its own worker (vLLM's ``load_from_store``) is
    handed only the store's path, so no tensor crosses a process boundary; any other gets the
    store's zero-copy tensors through ``load_weights``. Raises CheckpointError when the version
    is not in the store."""
    from_store = getattr(engine, "load_from_store", None)
    if from_store is not None and hasattr(store, "acquire"):
        return int(from_store(store, model, version))
    got, _, tensors = store.load(model, version)
    engine.load_weights(tensors, got)
    return got


__all__ = ["ENGINE_KINDS", "Engine", "load_version", "make_engine"]
