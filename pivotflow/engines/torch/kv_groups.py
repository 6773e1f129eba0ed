"""The serving cache for a model whose attention layers cache keys of different shapes (Gemma
4's full layers: wider heads, fewer of them, than its sliding ones): one ``SlotKVCache`` per
shape, each layer's keys and values in its own, every one of them told of each prefill, decode
step and slot move so their slots stay in step. ``serving_cache`` picks the plain cache
where every layer's shape is one.
"""

from __future__ import annotations

import torch

from pivotflow.engines.torch.linear_states import LinearStates
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.engines.torch.slot_cache import SlotKVCache


class LayerGroupsKVCache:
    """``SlotKVCache``'s interface over one such cache per (key/value heads, width) of
    ``cfg``'s attention layers."""

    def __init__(self, cfg: ModelConfig, max_batch: int, max_len: int,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        shapes: dict[tuple[int, int], list[int]] = {}
        for layer in cfg.cached_layers:
            shapes.setdefault(cfg.layer_cache_shape(layer), []).append(layer)
        self.groups = [SlotKVCache(cfg, max_batch, max_len, device, dtype, tuple(layers))
                       for layers in shapes.values()]
        self._of = {layer: cache for cache in self.groups for layer in cache.layers}
        self.states: LinearStates | None = None  # (no linear layers in such a model)

    def begin_prefill(self, start: int, lengths: list[int]) -> None:
        for cache in self.groups:
            cache.begin_prefill(start, lengths)

    def begin_decode(self, n: int) -> torch.Tensor:
        return [cache.begin_decode(n) for cache in self.groups][0]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        return self._of[layer].update(layer, k, v)

    def append(self, layer: int, kv: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._of[layer].append(layer, kv)

    def move(self, src: int, dst: int) -> None:
        for cache in self.groups:
            cache.move(src, dst)

    @property
    def prefill_shape(self) -> tuple[int, int]:
        return self.groups[0].prefill_shape

    @property
    def prefill_slots(self) -> tuple[int, torch.Tensor]:
        return self.groups[0].prefill_slots

    @property
    def prefilling(self) -> bool:
        return self.groups[0].prefilling


ServingCache = SlotKVCache | LayerGroupsKVCache


def serving_cache(cfg: ModelConfig, max_batch: int, max_len: int,
                  device: torch.device | str, dtype: torch.dtype) -> ServingCache:
    """The slot cache for ``cfg``'s engine: one ``SlotKVCache``, or one per key shape where
    its attention layers' differ."""
    shapes = {cfg.layer_cache_shape(i) for i in cfg.cached_layers}
    if shapes - {(cfg.cache_kv_heads, cfg.cache_head_dim)}:
        return LayerGroupsKVCache(cfg, max_batch, max_len, device, dtype)
    return SlotKVCache(cfg, max_batch, max_len, device, dtype)
