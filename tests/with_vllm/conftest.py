"""Registers the vLLM test fixtures (defined in vllm_fixtures.py, which tests also import)."""

from __future__ import annotations

from vllm_fixtures import folder, one_torch_thread, store, vllm_engine, weights

__all__ = ["folder", "one_torch_thread", "store", "vllm_engine", "weights"]
