"""A slot-based, preallocated KV cache for continuous batching, and the decode step that reads it.

Each running sequence owns one slot of a ``[layers, 2, max_batch, kv_heads, max_len, head_dim]``
key/value buffer (index 0 of the second axis holds keys, 1 values) plus a length. The engine keeps
running sequences in slots ``0..n-1`` (it moves the last one into a hole when a sequence leaves),
so a decode step reads a plain view of the buffer, only up to the longest running sequence.

Prefill runs through ``Decoder.forward`` (the cache is its ``KVCacheHook``). Decode runs through
``DecodeStep``: the same math as ``Decoder.forward`` for one token per sequence, with q/k/v and
gate/up each done as one matmul, residual adds fused into the output matmuls, rotary embeddings
read from a table, and attention as two batched matmuls over the cache view.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from pivotflow.engines.torch.model import Decoder, ModelConfig, rotary_cos_sin
from pivotflow.errors import EngineError


class SlotKVCache:
    """Keys and values for up to ``max_batch`` sequences of up to ``max_len`` tokens each.

    Implements ``KVCacheHook`` for prefill: call ``begin_prefill``, then the attention layers
    call ``update`` once each. Decode: ``begin_decode``, then ``append`` once per layer.

    Slots hold ``capacity`` positions, the longest running sequence rounded up to ``CHUNK``,
    not ``max_len``: the running slots' keys (and values) of a layer are then one contiguous
    block, which batched matmuls stream about twice as fast as blocks with gaps between them.
    Changing the capacity re-lays the buffer out (every ``CHUNK`` decode steps at most).
    """

    CHUNK = 16

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
        self._blocks = (cfg.num_hidden_layers, 2, max_batch, self.n_kv)
        numel = cfg.num_hidden_layers * 2 * max_batch * self.n_kv * max_len * self.head_dim
        # Rows past a slot's length are read and masked out: they must hold finite numbers.
        self._storage = torch.zeros(numel, device=device, dtype=dtype)
        self.lens = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.dtype = dtype
        # Block (key|value, slot, head) of one layer, in the order a decode step's new
        # keys/values arrive: [slot, key|value, head].
        kind = torch.arange(2, device=device)[:, None] * max_batch
        rows = (kind[None] + torch.arange(max_batch, device=device)[:, None, None]) * self.n_kv
        self._block_ids = rows + torch.arange(self.n_kv, device=device)
        self._positions = torch.arange(max_len, device=device)
        self.capacity = 0
        self._set_capacity(min(max_len, self.CHUNK))
        self._mode = ""
        self._start = self._count = self._width = 0
        self._rows = self._block_ids[:0].reshape(-1)
        self._mask: torch.Tensor | None = None

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
        self._fit(width, start, grow_only=True)
        device = self.lens.device
        lens = torch.tensor(lengths, dtype=torch.long, device=device)
        self.lens[start : start + count] = lens
        self._mask = None  # equal lengths: plain causal attention, no padding to hide
        if min(lengths) != width:
            causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
            real = self._positions[:width][None, :] < lens[:, None]
            self._mask = causal[None, None] & real[:, None, None, :]
        self._mode, self._start, self._count, self._width = "prefill", start, count, width

    @property
    def prefill_shape(self) -> tuple[int, int]:
        """(sequences, padded length) of the prefill begun last."""
        return self._count, self._width

    def begin_decode(self, n: int) -> torch.Tensor:
        """The next decode step appends one token to each of slots ``0..n-1``; returns their
        positions [n]. Raises EngineError when a slot is full."""
        pos = self.lens[:n].clone()
        lo, hi = pos.aminmax()
        shortest, width = int(lo), int(hi) + 1
        if width > self.max_len:
            raise EngineError(f"a sequence reached the cache length {self.max_len}")
        self._fit(width, n)
        cap = self.capacity
        self._rows = (self._block_ids[:n] * cap + pos[:, None, None]).view(-1)
        self._mask = None  # every slot full to capacity after this token: nothing to hide
        if shortest + 1 != cap:
            # Additive mask [n * kv_heads, 1, capacity] hiding each slot's unused tail.
            hidden = self._positions[:cap] > pos.repeat_interleave(self.n_kv)[:, None]
            mask = torch.zeros(hidden.shape, dtype=self.dtype, device=pos.device)
            self._mask = mask.masked_fill_(hidden, float("-inf"))[:, None]
        self.lens[:n] += 1
        self._mode, self._count = "decode", n
        return pos

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Prefill: store this layer's keys/values [B, Hkv, T, D]; return what attention reads.
        Raises EngineError outside a prefill."""
        if self._mode != "prefill":
            raise EngineError("KV cache used by a forward pass without begin_prefill")
        rows = slice(self._start, self._start + self._count)
        self.kv[layer, 0, rows, :, : self._width] = k
        self.kv[layer, 1, rows, :, : self._width] = v
        return k, v, self._mask

    def append(
        self, layer: int, kv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Decode: store this layer's new keys/values ``kv`` [n, 2 * kv_heads, D] (keys first).
        Returns keys and values [n * kv_heads, capacity, D] and the additive mask (None:
        none). Raises EngineError outside a decode step."""
        if self._mode != "decode":
            raise EngineError("KV cache append without begin_decode")
        n, cap, d = self._count, self.capacity, self.head_dim
        buf = self.kv[layer]
        # index_copy_ into a flat view writes each row at its own position in one kernel.
        buf.view(-1, d).index_copy_(0, self._rows, kv.reshape(-1, d))
        keys = buf[0, :n].view(n * self.n_kv, cap, d)  # views: running slots are dense
        return keys, buf[1, :n].view(n * self.n_kv, cap, d), self._mask

    def move(self, src: int, dst: int) -> None:
        """Copy slot ``src`` (its filled part) into slot ``dst``."""
        length = int(self.lens[src])
        self.kv[:, :, dst, :, :length] = self.kv[:, :, src, :, :length]
        self.lens[dst] = length

    def _set_capacity(self, capacity: int) -> None:
        numel = self._blocks[0] * self._blocks[1] * self._blocks[2] * self._blocks[3]
        size = numel * capacity * self.head_dim
        self.kv = self._storage[:size].view(*self._blocks, capacity, self.head_dim)
        self.capacity = capacity

    def _fit(self, width: int, running: int, grow_only: bool = False) -> None:
        """Make the capacity hold ``width`` positions, shrinking it when it is a chunk or more
        too large, and keep slots ``0..running-1`` (their first ``capacity`` positions)."""
        want = min(self.max_len, -(-width // self.CHUNK) * self.CHUNK)
        if want == self.capacity or (want < self.capacity and (grow_only or want + self.CHUNK > self.capacity)):
            return
        keep = min(want, self.capacity)
        kept = self.kv[:, :, :running, :, :keep].clone()
        self._set_capacity(want)
        self.kv[:, :, :running, :, :keep] = kept


def pack_linears(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights (and biases) of ``linears`` along the output axis and make each
    layer's parameters views into the result, so one matmul computes all of them and a later
    ``param.copy_`` (a weight load) updates the packed tensors in place. Returns (weight, bias)."""
    weight = torch.cat([m.weight for m in linears])
    has_bias = linears[0].bias is not None
    bias = torch.cat([m.bias for m in linears]) if has_bias else None  # type: ignore[misc]
    start = 0
    for m in linears:
        stop = start + m.weight.shape[0]
        m.weight = nn.Parameter(weight[start:stop], requires_grad=False)
        if bias is not None:
            m.bias = nn.Parameter(bias[start:stop], requires_grad=False)
        start = stop
    return weight, bias


class PackedDecoder:
    """``model``'s forward pass specialised for serving from a ``SlotKVCache``: ``prefill``
    (whole prompts) and ``decode`` (one token per sequence), each returning logits [n, vocab]
    for one position per sequence.

    Builds on the model's own parameters (``pack_linears`` turns them into views of packed
    tensors), so weights loaded into ``model`` later are seen here without a refresh.
    """

    def __init__(self, model: Decoder, max_len: int) -> None:
        cfg = model.config
        self.model, self.cfg = model, cfg
        self.n_heads, self.n_kv, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.layers = []
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            w_qkv, b_qkv = pack_linears([attn.q_proj, attn.k_proj, attn.v_proj])
            w_gate_up, _ = pack_linears([mlp.gate_proj, mlp.up_proj])
            norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
            # Transposed views, [in, out], as addmm/mm take them.
            weights = (w_qkv.t(), attn.o_proj.weight.t(), w_gate_up.t(), mlp.down_proj.weight.t())
            self.layers.append((norms, b_qkv, weights))
        weight = model.model.embed_tokens.weight
        d, heads = cfg.head_dim, cfg.num_attention_heads
        positions = torch.arange(max_len, device=weight.device)[None]
        cos, sin = rotary_cos_sin(positions, d, cfg.rope_theta, torch.float32)
        sin = sin.clone()
        sin[..., : d // 2] *= -1  # rotate_half(x) * sin == roll(x, D/2) * sin, first half negated
        # [max_len, cos|sin, heads + kv_heads, D]; query rows carry the 1/sqrt(D) score scale.
        rope = torch.stack((cos[0, 0], sin[0, 0]), 1)[:, :, None].repeat(1, 1, heads + self.n_kv, 1)
        rope[:, :, :heads] *= d**-0.5
        self._rope = rope.to(weight.dtype)

    def prefill(self, ids: torch.Tensor, last: torch.Tensor, cache: SlotKVCache) -> torch.Tensor:
        """Logits [B, vocab] at positions ``last`` [B] of right-padded prompts ``ids`` [B, T],
        after ``cache.begin_prefill``."""
        b, t = ids.shape
        x = self._layers(ids, self._rope[None, :t], self._attend_prompt, cache).view(b, t, -1)
        return self._logits(x[torch.arange(b, device=ids.device), last])

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, cache: SlotKVCache) -> torch.Tensor:
        """Logits [n, vocab] for ``tokens`` [n] at ``positions`` [n] (from ``begin_decode``)."""
        rope = self._rope[positions][:, None]
        return self._logits(self._layers(tokens[:, None], rope, self._attend_one, cache))

    def _layers(
        self,
        tokens: torch.Tensor,
        rope: torch.Tensor,
        attend: Callable[[int, torch.Tensor, torch.Tensor, SlotKVCache], torch.Tensor],
        cache: SlotKVCache,
    ) -> torch.Tensor:
        """Hidden states [B * T, hidden] after the decoder layers, for token ids [B, T] with
        rotary tables ``rope`` [B or 1, T, 2, heads + kv_heads, D]."""
        hidden, eps, inter = (self.cfg.hidden_size,), self.cfg.rms_norm_eps, self.cfg.intermediate_size
        heads, kv_heads, d = self.n_heads, self.n_kv, self.head_dim
        (b, t), split = tokens.shape, (heads + kv_heads) * d
        rows, cos, sin = b * t, rope[:, :, 0], rope[:, :, 1]
        x = self.model.model.embed_tokens.weight[tokens.view(-1)]
        for i, ((norm1, norm2), b_qkv, (w_qkv, w_o, w_gate_up, w_down)) in enumerate(self.layers):
            h = torch.rms_norm(x, hidden, norm1, eps)
            qkv = torch.mm(h, w_qkv) if b_qkv is None else torch.addmm(b_qkv, h, w_qkv)
            qk = qkv[:, :split].view(b, t, heads + kv_heads, d)
            qk = torch.addcmul(qk * cos, qk.roll(d // 2, -1), sin).view(rows, -1, d)
            x = torch.addmm(x, attend(i, qk, qkv[:, split:].view(rows, kv_heads, d), cache), w_o)
            gate_up = torch.mm(torch.rms_norm(x, hidden, norm2, eps), w_gate_up)
            x = torch.addmm(x, F.silu(gate_up[:, :inter]).mul_(gate_up[:, inter:]), w_down)
        return x

    def _attend_one(
        self, layer: int, qk: torch.Tensor, v: torch.Tensor, cache: SlotKVCache
    ) -> torch.Tensor:
        """Decode attention: roped queries/keys [n, heads + kv_heads, D], values [n, kv_heads,
        D] -> [n, heads * D]."""
        n, heads, kv_heads, d = qk.shape[0], self.n_heads, self.n_kv, self.head_dim
        keys, values, mask = cache.append(layer, torch.cat((qk[:, heads:], v), 1))
        # Each KV head's query heads are rows of one small matmul over its keys (no copies).
        q, kt = qk[:, :heads].reshape(n * kv_heads, heads // kv_heads, d), keys.transpose(1, 2)
        scores = torch.bmm(q, kt) if mask is None else torch.baddbmm(mask, q, kt)
        return torch.bmm(scores.softmax(-1), values).view(n, heads * d)

    def _attend_prompt(
        self, layer: int, qk: torch.Tensor, v: torch.Tensor, cache: SlotKVCache
    ) -> torch.Tensor:
        """Prefill attention over [B * T] rows, causal within each prompt."""
        heads, d = self.n_heads, self.head_dim
        b, t = cache.prefill_shape
        qk = qk.view(b, t, -1, d).transpose(1, 2)
        keys, values, mask = cache.update(layer, qk[:, heads:], v.view(b, t, -1, d).transpose(1, 2))
        out = F.scaled_dot_product_attention(
            qk[:, :heads], keys, values, mask, is_causal=mask is None, scale=1.0, enable_gqa=True
        )
        return out.transpose(1, 2).reshape(b * t, heads * d)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.rms_norm(x, (self.cfg.hidden_size,), self.model.model.norm.weight, self.cfg.rms_norm_eps)
        return torch.mm(x, self.model.lm_head.weight.t())
