"""A slot-based, preallocated KV cache for continuous batching.

Each running sequence owns one slot of ``[layers, max_batch, kv_heads, max_len, head_dim]`` key and
value buffers plus a length. The engine keeps running sequences in slots ``0..n-1`` (it moves the
last one into a hole when a sequence leaves), so a decode step reads a plain slice of the buffers
instead of gathering rows, and only up to the longest running sequence.
"""

from __future__ import annotations

import torch

from pivotflow.engines.torch.model import ModelConfig
from pivotflow.errors import EngineError


class SlotKVCache:
    """Keys and values for up to ``max_batch`` sequences of up to ``max_len`` tokens each.

    Implements ``KVCacheHook``: call ``begin_prefill`` or ``begin_decode`` before a forward pass,
    then the decoder's attention layers call ``update`` once each.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        max_batch: int,
        max_len: int,
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> None:
        self.max_batch, self.max_len = max_batch, max_len
        self.n_kv, self.head_dim = cfg.num_key_value_heads, cfg.head_dim
        shape = (cfg.num_hidden_layers, max_batch, self.n_kv, max_len, self.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.lens = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.dtype = dtype
        # Row offset of (slot, head, position 0) in a layer viewed as [rows, head_dim].
        slots = torch.arange(max_batch, device=device)[:, None] * self.n_kv
        self._slot_base = (slots + torch.arange(self.n_kv, device=device)) * max_len
        self._positions = torch.arange(max_len, device=device)
        self._mode = ""
        self._start = self._count = self._width = 0
        self._flat = self._slot_base[:0].reshape(-1)
        self._mask: torch.Tensor | None = None

    def begin_prefill(self, start: int, lengths: list[int]) -> None:
        """The next forward writes ``len(lengths)`` right-padded sequences into slots
        ``start..``, from position 0. Raises EngineError if they do not fit."""
        count, width = len(lengths), max(lengths)
        if start + count > self.max_batch or width > self.max_len:
            raise EngineError(
                f"prefill of {count} sequences (longest {width}) at slot {start} does not fit "
                f"a cache of {self.max_batch} slots x {self.max_len} tokens"
            )
        device = self.lens.device
        lens = torch.tensor(lengths, dtype=torch.long, device=device)
        self.lens[start : start + count] = lens
        self._mask = None  # equal lengths: plain causal attention, no padding to hide
        if min(lengths) != width:
            causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
            real = self._positions[:width][None, :] < lens[:, None]
            self._mask = causal[None, None] & real[:, None, None, :]
        self._mode, self._start, self._count, self._width = "prefill", start, count, width

    def begin_decode(self, n: int) -> torch.Tensor:
        """The next forward appends one token to each of slots ``0..n-1``; returns the positions
        [n, 1] to feed the model. Raises EngineError when a slot is full."""
        pos = self.lens[:n].clone()
        width = int(pos.max()) + 1
        if width > self.max_len:
            raise EngineError(f"a sequence reached the cache length {self.max_len}")
        self._flat = (self._slot_base[:n] + pos[:, None]).reshape(-1)
        hidden = self._positions[:width][None, :] > pos[:, None]
        mask = torch.zeros(n, 1, 1, width, dtype=self.dtype, device=pos.device)
        self._mask = mask.masked_fill_(hidden[:, None, None, :], float("-inf"))
        self.lens[:n] += 1
        self._mode, self._count, self._width = "decode", n, width
        return pos[:, None]

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Store this layer's new keys/values [B, Hkv, T, D]; return what attention reads."""
        if self._mode == "decode":
            n, width = self._count, self._width
            # index_copy_ into a flat view writes each row at its own position in one kernel.
            self.k[layer].view(-1, self.head_dim).index_copy_(
                0, self._flat, k.reshape(-1, self.head_dim)
            )
            self.v[layer].view(-1, self.head_dim).index_copy_(
                0, self._flat, v.reshape(-1, self.head_dim)
            )
            return self.k[layer, :n, :, :width], self.v[layer, :n, :, :width], self._mask
        if self._mode == "prefill":
            rows = slice(self._start, self._start + self._count)
            self.k[layer, rows, :, : self._width] = k
            self.v[layer, rows, :, : self._width] = v
            return k, v, self._mask
        raise EngineError("KV cache used without begin_prefill/begin_decode")

    def move(self, src: int, dst: int) -> None:
        """Copy slot ``src`` (its filled part) into slot ``dst``."""
        length = int(self.lens[src])
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]
        self.lens[dst] = length


class SlotResponses:
    """The response side of each slot: token ids (resume prefix included), their logprobs and
    versions, the response length, its limit, and the stop token ids that end it."""

    def __init__(self, max_batch: int, max_len: int, device: torch.device | str) -> None:
        self.tokens = torch.zeros(max_batch, max_len, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(max_batch, max_len, dtype=torch.float32, device=device)
        self.versions = torch.zeros(max_batch, max_len, dtype=torch.long, device=device)
        self.count = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.limit = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.stop_ids = torch.full((max_batch, 1), -1, dtype=torch.long, device=device)
        self._rows = torch.arange(max_batch, device=device)

    def install(
        self,
        slot: int,
        prefix: tuple[list[int], list[float], list[int]],
        limit: int,
        stop_ids: list[int],
    ) -> None:
        """Start ``slot`` with a resume prefix (ids, logprobs, versions), a length limit and
        its stop token ids."""
        ids, logprobs, versions = prefix
        if ids:
            k = len(ids)
            self.tokens[slot, :k] = torch.tensor(ids)
            self.logprobs[slot, :k] = torch.tensor(logprobs, dtype=torch.float32)
            self.versions[slot, :k] = torch.tensor(versions)
        self.count[slot], self.limit[slot] = len(ids), limit
        if len(stop_ids) > self.stop_ids.shape[1]:  # widen the table for this request
            extra = len(stop_ids) - self.stop_ids.shape[1]
            self.stop_ids = torch.nn.functional.pad(self.stop_ids, (0, extra), value=-1)
        self.stop_ids[slot] = -1
        self.stop_ids[slot, : len(stop_ids)] = torch.tensor(stop_ids, dtype=torch.long)

    def append(
        self, start: int, tokens: torch.Tensor, logprobs: torch.Tensor, version: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append one token to each of slots ``start..start+n-1``; return (stopped, finished)
        masks [n]: hit a stop token, and stopped or reached the limit."""
        span = slice(start, start + tokens.shape[0])
        rows, index = self._rows[span], self.count[span]
        self.tokens.index_put_((rows, index), tokens)
        self.logprobs.index_put_((rows, index), logprobs)
        self.versions[rows, index] = version
        self.count[span] += 1
        stopped = (self.stop_ids[span] == tokens[:, None]).any(-1)
        return stopped, stopped | (self.count[span] >= self.limit[span])

    def last_tokens(self, n: int) -> torch.Tensor:
        """[n, 1]: the newest token of slots 0..n-1, the next decode step's input."""
        return self.tokens[:n].gather(1, (self.count[:n] - 1)[:, None])

    def read(self, slot: int) -> tuple[list[int], list[float], list[int]]:
        """(token ids, logprobs, versions) of ``slot``'s response so far."""
        n = int(self.count[slot])
        return (
            self.tokens[slot, :n].tolist(),
            self.logprobs[slot, :n].tolist(),
            self.versions[slot, :n].tolist(),
        )

    def tail(self, slot: int, window: int) -> list[int]:
        """The last ``window`` token ids of ``slot``'s response."""
        n = int(self.count[slot])
        return self.tokens[slot, max(0, n - window) : n].tolist()

    def move(self, src: int, dst: int) -> None:
        """Copy slot ``src`` into slot ``dst``."""
        n = int(self.count[src])
        for buf in (self.tokens, self.logprobs, self.versions):
            buf[dst, :n] = buf[src, :n]
        for buf in (self.count, self.limit, self.stop_ids):
            buf[dst] = buf[src]
