"""The slot KV cache for continuous batching: what each running sequence holds.

Each running sequence owns one slot: ``capacity`` positions of keys and values per layer and KV
head, plus a length. The engine keeps running sequences in slots ``0..n-1`` (it moves the last
one into a hole when a sequence leaves), so a decode step reads plain views of the buffer.
Latent attention keeps keys alone (its values are the keys' latent part); a hybrid's linear
layers (gated DeltaNet, Mamba2) keep a fixed-size state per slot instead (``LinearStates``, owned here and moved
with their slot). Layers whose keys differ in shape (Gemma 4's) are kept by one cache per shape
(``kv_groups``). ``kv_cache.PackedDecoder`` is the forward pass that serves from it.
"""

from __future__ import annotations

import torch

from pivotflow.engines.torch.linear_states import LinearStates
from pivotflow.engines.torch.model import ModelConfig, attention_mask_of
from pivotflow.errors import EngineError


class SlotKVCache:
    """Keys and values for up to ``max_batch`` sequences of up to ``max_len`` tokens each.

    Implements ``KVCacheHook`` for prefill: call ``begin_prefill``, then the attention layers
    call ``update`` once each. Decode: ``begin_decode``, then ``append`` once per layer.

    Slots hold ``capacity`` positions, the longest running sequence rounded up to ``CHUNK``,
    not ``max_len``: the running slots' keys (and values) of a layer are then one contiguous
    block, which batched matmuls stream about twice as fast as blocks with gaps between them.
    Changing the capacity re-lays the buffer out (every ``CHUNK`` decode steps at most). Decode
    attention reads whole slots and masks each one's unused tail with an additive bias kept up
    to date as tokens are appended. Sliding-window layers (``ModelConfig.sliding_layers``) get
    masks of their own that also hide the keys behind the window (Llama 4's chunked layers:
    those before the chunk); every position stays cached
    (a window saves compute and memory only in engines that evict, which this one does not).
    """

    CHUNK = 16

    def __init__(
        self,
        cfg: ModelConfig,
        max_batch: int,
        max_len: int,
        device: torch.device | str,
        dtype: torch.dtype,
        layers: tuple[int, ...] = (),
    ) -> None:
        """``layers``: the attention layers this cache keeps, all of one shape
        (``kv_groups``); empty: every attention layer, all of ``cfg``'s cache shape."""
        self.max_batch, self.max_len, self.dtype = max_batch, max_len, dtype
        self.layers = layers or cfg.cached_layers
        self.n_kv, self.head_dim = (cfg.layer_cache_shape(layers[0]) if layers
                                    else (cfg.cache_kv_heads, cfg.cache_head_dim))
        self._sliding = frozenset(cfg.sliding_layers) & frozenset(self.layers)
        self._window = cfg.sliding_window if self._sliding else 0
        self._chunked = bool(cfg.attention_chunk_size)  # (Llama 4's: chunks, not windows)
        # keys and values for the attention layers only (a hybrid's linear layers keep states)
        self._cached = {layer: i for i, layer in enumerate(self.layers)}
        self.states = (LinearStates(cfg, max_batch, device, dtype)
                       if cfg.linear_attention_layers and not layers else None)
        blocks = max(1, len(self._cached))
        # Latent attention's values are its keys' latent part (PackedLatent): keys alone
        self._kinds = 1 if cfg.latent_attention else 2
        self._blocks = (blocks, self._kinds, max_batch, self.n_kv)
        numel = blocks * self._kinds * max_batch * self.n_kv * max_len * self.head_dim
        # Rows past a slot's length are read and masked out: they must hold finite numbers.
        self._storage = torch.zeros(numel, device=device, dtype=dtype)
        self._bias_storage = torch.zeros(
            max_batch * self.n_kv * max_len, device=device, dtype=dtype
        )
        self._scratch = torch.empty(numel // blocks, device=device, dtype=dtype)
        self.lens = torch.zeros(max_batch, dtype=torch.long, device=device)
        self._host_lens = [0] * max_batch  # lens on the host: sizes without a device sync
        # Block (key|value, slot, head) of one layer, in the order a decode step's new
        # keys/values arrive: [slot, key|value, head]; keys' blocks double as bias rows.
        kind = torch.arange(self._kinds, device=device)[:, None] * max_batch
        rows = (kind[None] + torch.arange(max_batch, device=device)[:, None, None]) * self.n_kv
        self._block_ids = rows + torch.arange(self.n_kv, device=device)
        self._positions = torch.arange(max_len, device=device)
        self.capacity = 0
        self._set_capacity(min(max_len, self.CHUNK))
        self._mode = ""
        self._start = self._count = self._width = 0
        self._rows = self._block_ids[:0].reshape(-1)
        self._mask: torch.Tensor | None = None
        self._sliding_mask: torch.Tensor | None = None  # a prefill's, for sliding layers
        self._sliding_bias: torch.Tensor | None = None  # a decode step's, for sliding layers

    def begin_prefill(self, start: int, lengths: list[int]) -> None:
        """The next forward writes ``len(lengths)`` right-padded sequences into slots
        ``start..`` (slots ``0..start-1`` are running), from position 0. Raises EngineError if
        they do not fit."""
        count, width = len(lengths), max(lengths)
        if start + count > self.max_batch or width > self.max_len:
            raise EngineError(
                f"prefill of {count} sequences (longest {width}) at slot {start} does not fit "
                f"a cache of {self.max_batch} slots x {self.max_len} tokens"
            )
        self._fit(width + 1, start, grow_only=True)  # + their first decoded token
        device = self.lens.device
        lens = torch.tensor(lengths, dtype=torch.long, device=device)
        self.lens[start : start + count] = lens
        self._host_lens[start : start + count] = lengths
        real = self._positions[:width][None, :] < lens[:, None]
        self._unmask(slice(start, start + count), real)
        self._mask = None  # equal lengths: plain causal attention, no padding to hide
        if min(lengths) != width:
            causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
            self._mask = causal[None, None] & real[:, None, None, :]
        if self._window:
            padded = real if min(lengths) != width else None
            self._sliding_mask = attention_mask_of(width, padded, self._window, device,
                                                   self._chunked)
        self._mode, self._start, self._count, self._width = "prefill", start, count, width

    @property
    def prefill_shape(self) -> tuple[int, int]:
        """(sequences, padded length) of the prefill begun last."""
        return self._count, self._width

    @property
    def prefill_slots(self) -> tuple[int, torch.Tensor]:
        """(first slot, lengths [sequences]) of the prefill begun last."""
        return self._start, self.lens[self._start:self._start + self._count]

    @property
    def prefilling(self) -> bool:
        """Whether the forward pass under way is a prefill (else a decode step)."""
        return self._mode == "prefill"

    def begin_decode(self, n: int) -> torch.Tensor:
        """The next decode step appends one token to each of slots ``0..n-1``; returns their
        positions [n]. Raises EngineError when a slot is full."""
        host = self._host_lens
        width = max(host[:n]) + 1
        if width > self.max_len:
            raise EngineError(f"a sequence reached the cache length {self.max_len}")
        self._fit(width, n)
        pos = self.lens[:n].clone()
        self._rows = (self._block_rows[:n] + pos[:, None, None]).view(-1)
        # The new token's own position becomes visible (the keys' rows of _rows).
        self._bias.view(-1).index_fill_(
            0, self._rows.view(n, self._kinds, -1)[:, 0].reshape(-1), 0.0)
        self.lens[:n] += 1
        host[:n] = [length + 1 for length in host[:n]]
        self._sliding_bias = None
        if self._window and max(host[:n]) > self._window:
            # key j is seen from the new token (position len - 1) when j >= len - window; in
            # a chunk, when j is in the new token's chunk
            first = (torch.div(self.lens[:n] - 1, self._window, rounding_mode="floor")
                     * self._window if self._chunked else self.lens[:n] - self._window)
            behind = self._positions[: self.capacity] < first[:, None]
            self._sliding_bias = self._bias[:n].masked_fill(behind[:, None], float("-inf"))
        self._mode, self._count = "decode", n
        return pos

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Prefill: store this layer's keys/values [B, Hkv, T, D]; return what attention reads.
        Raises EngineError outside a prefill."""
        if self._mode != "prefill":
            raise EngineError("KV cache used by a forward pass without begin_prefill")
        rows, at = slice(self._start, self._start + self._count), self._cached[layer]
        self.kv[at, 0, rows, :, : self._width] = k
        if self._kinds == 1:  # (latent attention: the keys are the values)
            v = k
        else:
            self.kv[at, 1, rows, :, : self._width] = v
        return k, v, self._sliding_mask if layer in self._sliding else self._mask

    def append(
        self, layer: int, kv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Decode: store this layer's new keys/values ``kv`` [n, 2 * kv_heads, D] (keys first;
        latent attention: keys alone, [n, kv_heads, D]). Returns keys and values [n * kv_heads,
        capacity, D] and the additive mask [n * kv_heads, 1, capacity]. Raises EngineError
        outside a decode step."""
        if self._mode != "decode":
            raise EngineError("KV cache append without begin_decode")
        n, cap, d = self._count, self.capacity, self.head_dim
        buf = self.kv[self._cached[layer]]
        # index_copy_ into a flat view writes each row at its own position in one kernel.
        buf.view(-1, d).index_copy_(0, self._rows, kv.reshape(-1, d))
        keys = buf[0, :n].view(n * self.n_kv, cap, d)  # views: running slots are dense
        values = buf[self._kinds - 1, :n].view(n * self.n_kv, cap, d)
        bias = self._bias[:n]
        if self._sliding_bias is not None and layer in self._sliding:
            bias = self._sliding_bias
        return keys, values, bias.view(n * self.n_kv, 1, cap)

    def move(self, src: int, dst: int) -> None:
        """Copy slot ``src`` (its filled part) into slot ``dst``."""
        length = self._host_lens[src]
        self.kv[:, :, dst, :, :length] = self.kv[:, :, src, :, :length]
        self._bias[dst] = self._bias[src]
        self.lens[dst], self._host_lens[dst] = length, length
        if self.states is not None:
            self.states.move(src, dst)

    def _unmask(self, slots: slice, real: torch.Tensor) -> None:
        """Set the bias of ``slots`` from ``real`` [slots, width] (True: a cached position)."""
        bias = self._bias[slots].fill_(float("-inf"))
        bias[:, :, : real.shape[1]].masked_fill_(real[:, None], 0.0)

    def _set_capacity(self, capacity: int) -> None:
        layers, kinds, slots, heads = self._blocks
        size = layers * kinds * slots * heads * capacity * self.head_dim
        self.kv = self._storage[:size].view(*self._blocks, capacity, self.head_dim)
        self._bias = self._bias_storage[: slots * heads * capacity].view(slots, heads, capacity)
        self._block_rows = self._block_ids * capacity
        self.capacity = capacity

    def _fit(self, width: int, running: int, grow_only: bool = False) -> None:
        """Make the capacity hold ``width`` positions, shrinking it when it is a chunk or more
        too large, and keep slots ``0..running-1``."""
        want = min(self.max_len, -(-width // self.CHUNK) * self.CHUNK)
        shrink = want + self.CHUNK <= self.capacity and not grow_only
        if want <= self.capacity and not shrink:
            return
        if not running:
            self._set_capacity(want)
            return
        keep, old = min(want, self.capacity), self.kv
        self._set_capacity(want)
        # Layer by layer through one scratch buffer; growing moves data up the storage, so
        # go top down (and bottom up when shrinking) to never overwrite a layer not yet moved.
        order = range(self._blocks[0] - 1, -1, -1) if want > keep else range(self._blocks[0])
        for layer in order:
            kept = self._scratch[: self._kinds * running * self.n_kv * keep * self.head_dim]
            kept = kept.view(self._kinds, running, self.n_kv, keep, self.head_dim)
            kept.copy_(old[layer, :, :running, :, :keep])
            self.kv[layer, :, :running, :, :keep] = kept
        real = self._positions[:want][None, :] < self.lens[:running, None]
        self._unmask(slice(0, running), real)
