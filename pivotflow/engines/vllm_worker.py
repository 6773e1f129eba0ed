"""Runs inside vLLM's worker process: weights come from the parameter store, not the socket.

``VllmEngine`` passes ``worker_extension_cls=WORKER_EXTENSION`` to ``vllm.LLM``; vLLM mixes
``StoreWeightLoader`` into its worker class, and the engine calls these methods *by name* through
``collective_rpc``. Only the store's path, a model name and a version number cross vLLM's socket
(msgpack), so ``VLLM_ALLOW_INSECURE_SERIALIZATION`` (which turns pickle on) is never needed.

Weights go through ``model_runner.reload_weights`` rather than ``model.load_weights``: vLLM's
CPU backend repacks every linear layer's weight into a oneDNN/sgl-kernel layout after loading and
drops the original parameter, so a plain ``load_weights`` the second time finds empty tensors.
``reload_weights`` is vLLM's layerwise in-place reload: it restores the checkpoint-format
parameters, calls the model's ``load_weights`` on HF names, then redoes the post-load processing.
That processing misses one layer on CPU: a tied ``lm_head`` shares the embedding's weight but is
its own module, gets no weights of its own (the checkpoint has none for it), so its prepacked
GEMM keeps the old embedding -- logits from the old weights. ``_repack_cpu_gemms`` rebuilds the
GEMM of every layer that kept its weight (found by vLLM 0.32 on a tied Qwen2: greedy tokens after
an update differed from the embedded engine's until it was added).

A mixture of experts has the same kind of gap: vLLM 0.32's unquantized MoE method prepacks the
experts for its CPU grouped GEMM only on the first load (``is_weight_update`` skips the experts'
own ``process_weights_after_loading``), so after a reload the kernel reads the checkpoint layout
as if packed: every token's output changes, even on a reload of the same weights (found on a
Qwen3-MoE). ``_repack_cpu_experts`` runs that step again.

The layerwise reload also reads every parameter's weight loader's ``__name__``, which a
``functools.partial`` has none of: MiniMax-M2's q/k norms' loaders are partials, and its first
load from the store failed with "'functools.partial' object has no attribute '__name__'"
(vLLM 0.32). ``_name_partial_loaders`` gives each such loader its function's name first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

WORKER_EXTENSION = "pivotflow.engines.vllm_worker.StoreWeightLoader"


class StoreWeightLoader:
    """Methods vLLM adds to its worker (``self`` is the worker: ``self.model_runner`` is there)."""

    model_runner: Any

    def pivotflow_load_from_store(self, root: str, model: str, version: int | None) -> int:
        """Map ``model@version`` (the latest when None) from the store at ``root`` and load it
        in place; returns the version loaded. The mapping is held only while loading."""
        from pivotflow.params.hf_layout import engine_names
        from pivotflow.params.shm_store import ShmParamStore

        with ShmParamStore(root).acquire(model, version) as held:
            self._pivotflow_reload(engine_names(held.config, held.tensors).items())
            return held.version

    def pivotflow_load_from_file(self, path: str) -> None:
        """Load HF-named tensors from a safetensors file (``VllmEngine.load_weights``)."""
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            self._pivotflow_reload((name, f.get_tensor(name)) for name in f.keys())  # noqa: SIM118

    def _pivotflow_reload(self, items: Iterable[tuple[str, torch.Tensor]]) -> None:
        with torch.no_grad():  # vLLM's loaders copy into parameters in place
            _name_partial_loaders(self.model_runner.get_model())
            self.model_runner.reload_weights(weights_iterator=items, is_checkpoint_format=True)
            _repack_cpu_gemms(self.model_runner.get_model())
            _repack_cpu_experts(self.model_runner.get_model())


def _name_partial_loaders(model: torch.nn.Module) -> None:
    """Give each parameter's ``functools.partial`` weight loader its function's ``__name__``,
    which vLLM's layerwise reload reads (a partial's attributes are its own to set)."""
    import functools

    for param in model.parameters():
        loader = getattr(param, "weight_loader", None)
        if isinstance(loader, functools.partial) and not hasattr(loader, "__name__"):
            loader.__name__ = getattr(loader.func, "__name__", "partial")  # type: ignore[attr-defined]


def _repack_cpu_gemms(model: torch.nn.Module) -> None:
    """Rebuild the CPU GEMM (``cpu_linear``) of each layer that still holds a 2-D weight.
    Linear layers drop theirs after packing (empty here) and were rebuilt by the reload."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    for module in model.modules():
        weight = getattr(module, "weight", None)
        kept = isinstance(weight, torch.Tensor) and weight.ndim == 2 and weight.numel() > 0
        if kept and hasattr(module, "cpu_linear"):
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)


def _repack_cpu_experts(model: torch.nn.Module) -> None:
    """Prepack each MoE layer's reloaded experts (``w13_weight``/``w2_weight``, left in the
    checkpoint's layout by the reload) into the CPU kernel's layout again."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is not None and hasattr(module, "w13_weight"):
            experts.process_weights_after_loading(module)
