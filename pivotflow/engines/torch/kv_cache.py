"""The slot KV cache for continuous batching, and the forward pass that serves from it.

Each running sequence owns one slot: ``capacity`` positions of keys and values per layer and KV
head, plus a length. The engine keeps running sequences in slots ``0..n-1`` (it moves the last
one into a hole when a sequence leaves), so a decode step reads plain views of the buffer.

``PackedDecoder`` is ``Decoder.forward`` specialised for this cache: q/k/v and gate/up each run
as one matmul over packed weights, residual adds are fused into the output matmuls, rotary
embeddings come from a table, and decode attention is two batched matmuls over whole slots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F

from pivotflow.engines.torch.deltanet_serving import LinearStates, PackedDeltaNet
from pivotflow.engines.torch.experts import PackedExperts, RoutingRecorder
from pivotflow.engines.torch.feedforward import MLP, SparseMoE, activation
from pivotflow.engines.torch.latent_attention import LatentAttention, PackedLatent
from pivotflow.engines.torch.linear import Linears, pack_linears, pack_mlp
from pivotflow.engines.torch.model import (
    Attention,
    Decoder,
    DecoderLayer,
    ModelConfig,
    attention_mask_of,
    eager_attention,
    embed_scale,
    soft_cap,
)
from pivotflow.engines.torch.rope import packed_rope_table, turn_partners
from pivotflow.errors import EngineError

_T = torch.Tensor
# A dense MLP's [out, in] weights for PackedDecoder (packed gate/up, down); a sparse layer is a
# PackedExperts.
_Dense = tuple[_T, _T]
# One layer for PackedDecoder: (norm weights, q/k/v bias, [out, in] weights q/k/v and o, o bias,
# Qwen3's q/k norm weights, the feed-forward)
_Packed = tuple[
    tuple[_T, _T], _T | None, tuple[_T, _T], _T | None, tuple[_T, _T] | None, _Dense | PackedExperts
]


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
    masks of their own that also hide the keys behind the window; every position stays cached
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
    ) -> None:
        self.max_batch, self.max_len, self.dtype = max_batch, max_len, dtype
        self.n_kv, self.head_dim = cfg.cache_kv_heads, cfg.cache_head_dim
        self._sliding = frozenset(cfg.sliding_layers)
        self._window = cfg.sliding_window if self._sliding else 0
        # keys and values for the attention layers only (a hybrid's linear layers keep states)
        self._cached = {layer: i for i, layer in enumerate(cfg.attention_layers)}
        self.states = (LinearStates(cfg, max_batch, device, dtype)
                       if cfg.linear_attention_layers else None)
        layers = max(1, len(self._cached))
        # Latent attention's values are its keys' latent part (PackedLatent): keys alone
        self._kinds = 1 if cfg.latent_attention else 2
        self._blocks = (layers, self._kinds, max_batch, self.n_kv)
        numel = layers * self._kinds * max_batch * self.n_kv * max_len * self.head_dim
        # Rows past a slot's length are read and masked out: they must hold finite numbers.
        self._storage = torch.zeros(numel, device=device, dtype=dtype)
        self._bias_storage = torch.zeros(
            max_batch * self.n_kv * max_len, device=device, dtype=dtype
        )
        self._scratch = torch.empty(numel // layers, device=device, dtype=dtype)
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
            self._sliding_mask = attention_mask_of(width, padded, self._window, device)
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
            # key j is seen from the new token (position len - 1) when j >= len - window
            behind = self._positions[: self.capacity] < (self.lens[:n] - self._window)[:, None]
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


class PackedDecoder:
    """``model``'s forward pass specialised for serving from a ``SlotKVCache``: ``prefill``
    (whole prompts) and ``decode`` (one token per sequence), each returning logits [n, vocab]
    at one position per sequence.

    Builds on the model's own parameters (``pack_linears`` turns them into views of packed
    tensors), so weights loaded into ``model`` later are seen here without a refresh.
    """

    def __init__(self, model: Decoder, max_len: int) -> None:
        cfg = self.cfg = model.config
        # (latent attention attends in its latent: one cached head of the latent's width)
        self.model, self.heads, self.kv_heads = model, cfg.num_attention_heads, cfg.cache_kv_heads
        self.d = cfg.cache_head_dim
        self.mm = Linears.for_weights(model.lm_head.weight)
        self.layers: list[_Packed] = []
        # each layer's attention sinks [heads] (gpt-oss's), or None
        self._sinks = [None if layer.linear else layer.self_attn.sinks
                       for layer in cast(list[DecoderLayer], model.model.layers)]
        self.experts: list[PackedExperts] = []  # the sparse layers, in order
        # the norms of layers that normalise sub-layer outputs (_output_norm_layer), per layer
        self._out_norms: list[tuple[_T | None, _T, _T | None, _T]] = []
        self._act = activation(cfg.hidden_act)
        # each layer's latent attention projections (DeepSeek-V3's), or None
        self._latent: list[PackedLatent | None] = []
        # each layer's gated DeltaNet (Qwen3.5's linear layers), or None
        self._linear: list[PackedDeltaNet | None] = []
        for i, layer in enumerate(cast(list[DecoderLayer], model.model.layers)):
            linear = (PackedDeltaNet(layer.linear_attn, cfg.linear_attention_layers.index(i))
                      if layer.linear else None)
            self._linear.append(linear)
            attn = None if linear else layer.self_attn
            if linear is not None:
                self._latent.append(None)
                w_qkv, b_qkv = linear.weight, None
            elif isinstance(attn, LatentAttention):
                self._latent.append(PackedLatent(attn, cfg))
                w_qkv, b_qkv = attn.kv_a_proj_with_mqa.weight, None  # (unused: _latent's)
            else:
                assert isinstance(attn, Attention)
                self._latent.append(None)
                w_qkv, b_qkv = pack_linears([attn.q_proj, attn.k_proj, attn.v_proj])
            # (input, post-attention): what pre-norm layers read; the others read _out_norms
            norms = (getattr(layer, "input_layernorm", layer.post_attention_layernorm).weight,
                     layer.post_attention_layernorm.weight)
            if cfg.post_norm or cfg.sandwich_norm:  # (input, attention out, MLP in, MLP out)
                self._out_norms.append((
                    layer.input_layernorm.weight if cfg.sandwich_norm else None,
                    layer.post_attention_layernorm.weight,
                    layer.pre_feedforward_layernorm.weight if cfg.sandwich_norm else None,
                    layer.post_feedforward_layernorm.weight))  # fmt: skip
            qk_norms = None
            if attn is not None and attn.q_norm is not None and attn.k_norm is not None:
                qk_norms = (attn.q_norm.weight, attn.k_norm.weight)
            ffn: _Dense | PackedExperts
            if isinstance(layer.mlp, SparseMoE):
                shared = layer.mlp.shared_experts or layer.mlp.shared_expert
                ffn = PackedExperts(layer.mlp, self.mm, len(self.experts),
                                    None if shared is None else pack_mlp(shared))
                self.experts.append(ffn)
            else:
                ffn = pack_mlp(cast(MLP, layer.mlp))
            out_proj = linear.module.out_proj if linear else attn.o_proj  # type: ignore[union-attr]
            self.layers.append((norms, b_qkv, (w_qkv, out_proj.weight), out_proj.bias, qk_norms,
                                ffn))
        # each rotary dimension's partner for _turned (rope.turn_partners)
        self._partner = turn_partners(cfg, self.d, model.lm_head.weight.device)
        # one rotary table per rope kind (ModelConfig.rope_kind: full; sliding; none)
        self._rope_kinds = [cfg.rope_kind(i) for i in range(cfg.num_hidden_layers)]
        weight = model.lm_head.weight
        self._ropes = {k: packed_rope_table(cfg, k, max_len, self.d, (self.heads, self.kv_heads),
                                            weight.device, weight.dtype)
                       for k in dict.fromkeys(self._rope_kinds)}

    def _turned(self, qk: torch.Tensor) -> torch.Tensor:
        """Each head's dimensions moved onto their rotate_half partners (signs in the table)."""
        if self._partner is None:
            return qk.roll(self.d // 2, -1)
        return qk.index_select(-1, self._partner)

    def record_routing(self, recorder: RoutingRecorder | None) -> None:
        """Record every sparse layer's expert choices into ``recorder`` (None: stop)."""
        for experts in self.experts:
            experts.recorder = recorder

    def prefill(self, ids: torch.Tensor, last: torch.Tensor, cache: SlotKVCache) -> torch.Tensor:
        """Logits [B, vocab] at positions ``last`` [B] of right-padded prompts ``ids`` [B, T],
        after ``cache.begin_prefill``."""
        b, t = ids.shape
        ropes = {k: table[None, :t] for k, table in self._ropes.items()}
        x = self._layers(ids, ropes, self._attend_prompt, cache).view(b, t, -1)
        return self._logits(x[torch.arange(b, device=ids.device), last])

    def decode(
        self, tokens: torch.Tensor, positions: torch.Tensor, cache: SlotKVCache
    ) -> torch.Tensor:
        """Logits [n, vocab] for ``tokens`` [n] at ``positions`` [n] (from ``begin_decode``)."""
        ropes = {k: table[positions][:, None] for k, table in self._ropes.items()}
        return self._logits(self._layers(tokens[:, None], ropes, self._attend_decode, cache))

    def _layers(
        self,
        tokens: torch.Tensor,
        ropes: dict[str, torch.Tensor],
        attend: Callable[[int, torch.Tensor, torch.Tensor, SlotKVCache], torch.Tensor],
        cache: SlotKVCache,
    ) -> torch.Tensor:
        """Hidden states [B * T, hidden] after the decoder layers, for token ids [B, T] with
        rotary tables [B or 1, T, 2, heads + kv_heads, D] per rope kind (``ropes[kind]``)."""
        cfg, heads, kv_heads, d, mm = self.cfg, self.heads, self.kv_heads, self.d, self.mm
        hidden, eps, inter = (cfg.hidden_size,), cfg.rms_norm_eps, cfg.intermediate_size
        (b, t), split, post = tokens.shape, (heads + kv_heads) * d, cfg.post_norm
        x = self.model.model.embed_tokens.weight[tokens.view(-1)]
        if cfg.embed_scaled:
            x = x * embed_scale(cfg, x.dtype)
        elif cfg.embedding_multiplier != 1.0:  # (Granite's)
            x = x * cfg.embedding_multiplier
        scaled = cfg.residual_multiplier != 1.0  # (Granite's: sub-layer outputs scaled)
        offset = cfg.norm_offset
        for i, (norms, b_qkv, weights, b_o, qk_norms, ffn) in enumerate(self.layers):
            (norm1, norm2), (w_qkv, w_o) = norms, weights
            rope = ropes[self._rope_kinds[i]]
            if post or cfg.sandwich_norm:
                x = self._output_norm_layer(i, x, (b, t), rope, cache, attend)
                continue
            cos, sin = rope[:, :, 0], rope[:, :, 1]
            if offset:  # (Qwen3.5's norms scale by 1 + weight)
                norm1, norm2 = norm1 + 1, norm2 + 1
            h = torch.rms_norm(x, hidden, norm1, eps)
            latent, linear, gate = self._latent[i], self._linear[i], None
            if linear is not None:  # (Qwen3.5's gated DeltaNet: a state, no keys or values)
                out = self._linear_layer(linear, h, (b, t), cache)
            elif latent is not None:  # (DeepSeek-V3's: per-head q/k/v from its latents)
                qk, v = latent.qkv(h, mm)
                qk = qk.view(b, t, -1, d)
                qk = torch.addcmul(qk * cos, self._turned(qk), sin).view(b * t, -1, d)
                out = latent.output(attend(i, qk, v, cache))
            else:
                qkv = mm.linear(h, w_qkv, b_qkv)
                if qk_norms is not None and cfg.whole_qk_norm:  # (OLMoE's: before the heads)
                    self._whole_qk_norm(qkv, qk_norms)
                if cfg.attn_output_gate:  # (Qwen3.5's: q and gate interleaved by head)
                    qkv, gate = self._gate_split(qkv)
                qk = qkv[:, :split].view(b, t, heads + kv_heads, d)
                if qk_norms is not None and not cfg.whole_qk_norm:
                    # Qwen3: every head of q (of k) through one RMSNorm, before RoPE. Normalise
                    # all heads at once, then scale q's and k's heads by their own weights.
                    qk = torch.rms_norm(qk, (d,), None, eps)
                    qk[:, :, :heads].mul_(qk_norms[0] + int(offset))
                    qk[:, :, heads:].mul_(qk_norms[1] + int(offset))
                qk = torch.addcmul(qk * cos, self._turned(qk), sin).view(b * t, -1, d)
                out = attend(i, qk, qkv[:, split:].view(b * t, -1, d), cache)
            if gate is not None:
                out = out * torch.sigmoid(gate)
            x = (x + mm.linear(out, w_o, b_o) * cfg.residual_multiplier if scaled
                 else mm.linear_add(out, w_o, b_o, x))
            h = torch.rms_norm(x, hidden, norm2, eps)
            if isinstance(ffn, PackedExperts):
                x = ffn.add(h, x)
            else:
                w_gate_up, w_down = cast(_Dense, ffn)
                gated = mm.gated(h, w_gate_up, inter)
                x = (x + mm.linear(gated, w_down) * cfg.residual_multiplier if scaled
                     else mm.linear_add(gated, w_down, None, x))
        return x

    def _output_norm_layer(
        self,
        i: int,
        x: torch.Tensor,
        shape: tuple[int, int],
        rope: torch.Tensor,
        cache: SlotKVCache,
        attend: Callable[[int, torch.Tensor, torch.Tensor, SlotKVCache], torch.Tensor],
    ) -> torch.Tensor:
        """Layer ``i`` of the families that normalise each sub-layer's output before its
        residual add, on hidden states [B * T, hidden]. OLMo-2/3 (post-norm): nothing on the
        inputs, q and k RMS-normalised over their whole projections. Gemma 3 and GLM-4
        (sandwich): the inputs normalised too; Gemma's q and k per head, every norm scaling by
        1 + weight, the MLP gated by tanh-GELU (``self._act``)."""
        _, b_qkv, (w_qkv, w_o), b_o, qk_norms, ffn = self.layers[i]
        norm_in, norm_attn, norm_mlp_in, norm_mlp = self._out_norms[i]
        heads, kv_heads, d, mm, (b, t) = self.heads, self.kv_heads, self.d, self.mm, shape
        hidden, eps, split = (self.cfg.hidden_size,), self.cfg.rms_norm_eps, (heads + kv_heads) * d
        offset = self.cfg.norm_offset

        def norm(h: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
            if weight is None:  # (post-norm: no norm on a sub-layer's input)
                return h
            return torch.rms_norm(h, hidden, weight + 1 if offset else weight, eps)

        qkv = mm.linear(norm(x, norm_in), w_qkv, b_qkv)
        if qk_norms is not None and self.cfg.whole_qk_norm:  # (OLMo's: before the heads)
            self._whole_qk_norm(qkv, qk_norms)
        qk = qkv[:, :split].view(b, t, heads + kv_heads, d)
        if qk_norms is not None and not self.cfg.whole_qk_norm:  # each head, by 1 + weight
            qk = torch.rms_norm(qk, (d,), None, eps)
            qk[:, :, :heads].mul_(qk_norms[0] + int(offset))
            qk[:, :, heads:].mul_(qk_norms[1] + int(offset))
        qk = torch.addcmul(qk * rope[:, :, 0], self._turned(qk), rope[:, :, 1])
        out = attend(i, qk.view(b * t, -1, d), qkv[:, split:].view(b * t, -1, d), cache)
        x = x + norm(mm.linear(out, w_o, b_o), norm_attn)
        w_gate_up, w_down = cast(_Dense, ffn)
        h = mm.gated(norm(x, norm_mlp_in), w_gate_up, self.cfg.intermediate_size, self._act)
        return x + norm(mm.linear(h, w_down), norm_mlp)

    def _linear_layer(self, linear: PackedDeltaNet, h: torch.Tensor, shape: tuple[int, int],
                      cache: SlotKVCache) -> torch.Tensor:
        """A gated DeltaNet layer's output (out_proj's input) for rows ``h``, its states in
        ``cache``: a prefill's prompts or a decode step's tokens."""
        assert cache.states is not None
        if cache.prefilling:
            start, lengths = cache.prefill_slots
            return linear.prefill(h, shape, lengths, start, cache.states, self.mm)
        return linear.decode(h, cache.states, self.mm)

    def _gate_split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Qwen3.5's gated attention: q_proj's rows [head 0's query, its gate, head 1's...]
        then k, v -> (q|k|v [rows, (heads + 2 kv_heads) * D], gate [rows, heads * D])."""
        rows, heads, d = qkv.shape[0], self.heads, self.d
        q_gate = qkv[:, :2 * heads * d].view(rows, heads, 2, d)
        gate = q_gate[:, :, 1].reshape(rows, heads * d)
        return torch.cat((q_gate[:, :, 0].reshape(rows, heads * d), qkv[:, 2 * heads * d:]),
                         -1), gate

    def _whole_qk_norm(self, qkv: torch.Tensor, qk_norms: tuple[_T, _T]) -> None:
        """q and k RMS-normalised over their whole projections (OLMo-2/3's, OLMoE's), in place
        in the rows of ``qkv`` [n, (heads + 2 kv_heads) * D]."""
        q_width, split = self.heads * self.d, (self.heads + self.kv_heads) * self.d
        eps = self.cfg.rms_norm_eps
        qkv[:, :q_width] = torch.rms_norm(qkv[:, :q_width], (q_width,), qk_norms[0], eps)
        qkv[:, q_width:split] = torch.rms_norm(qkv[:, q_width:split], (split - q_width,),
                                               qk_norms[1], eps)

    def _attend_decode(
        self, layer: int, qk: torch.Tensor, v: torch.Tensor, cache: SlotKVCache
    ) -> torch.Tensor:
        """Roped queries+keys [n, heads + kv_heads, D], values [n, kv_heads, D] -> [n, heads*D]."""
        n, heads, kv_heads, d = qk.shape[0], self.heads, self.kv_heads, self.d
        # (latent attention: the cache keeps keys alone, its values the keys' latent part)
        new = qk[:, heads:] if self._latent[layer] is not None else torch.cat((qk[:, heads:], v), 1)
        keys, values, mask = cache.append(layer, new)
        # Each KV head's query heads are rows of one small matmul over its keys (no copies).
        q = qk[:, :heads].reshape(n * kv_heads, heads // kv_heads, d)
        if self.cfg.attn_logit_softcapping:  # (capped before the mask is added)
            scores = soft_cap(torch.bmm(q, keys.transpose(1, 2)),
                              self.cfg.attn_logit_softcapping) + mask
        else:
            scores = torch.baddbmm(mask, q, keys.transpose(1, 2))
        sinks = self._sinks[layer]
        if sinks is not None:  # (gpt-oss: each head's sink beside its scores, then dropped)
            sink = sinks.to(scores.dtype).view(1, kv_heads, -1, 1).expand(n, -1, -1, 1)
            scores = torch.cat((scores, sink.reshape(n * kv_heads, -1, 1)), -1)
            probs = scores.softmax(-1, dtype=torch.float32)[..., :-1].to(values.dtype)
            return torch.bmm(probs, values).view(n, heads * d)
        probs = scores.softmax(-1, dtype=torch.float32).to(values.dtype)
        return torch.bmm(probs, values).view(n, heads * d)

    def _attend_prompt(
        self, layer: int, qk: torch.Tensor, v: torch.Tensor, cache: SlotKVCache
    ) -> torch.Tensor:
        """The same over [B * T] rows of right-padded prompts, causal within each."""
        (b, t), heads, d = cache.prefill_shape, self.heads, self.d
        qk, v = qk.view(b, t, -1, d).transpose(1, 2), v.view(b, t, -1, d).transpose(1, 2)
        keys, values, mask = cache.update(layer, qk[:, heads:], v)
        if self.cfg.attn_logit_softcapping or self.cfg.attention_sinks:
            rep = heads // self.kv_heads
            out = eager_attention(
                qk[:, :heads], keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1),
                mask, 1.0, self.cfg.attn_logit_softcapping, self._sinks[layer])
        else:
            out = F.scaled_dot_product_attention(
                qk[:, :heads], keys, values, mask, is_causal=mask is None, scale=1.0,
                enable_gqa=True)
        return out.transpose(1, 2).reshape(b * t, heads * d)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        norm: torch.Tensor = self.model.model.norm.weight
        if self.cfg.norm_offset:  # (Gemma's norms scale by 1 + weight)
            norm = norm + 1
        h = torch.rms_norm(x, (self.cfg.hidden_size,), norm, self.cfg.rms_norm_eps)
        logits = self.mm.linear(h, self.model.lm_head.weight)
        if self.cfg.logits_scaling != 1.0:  # (Granite's)
            logits = logits / self.cfg.logits_scaling
        return soft_cap(logits, self.cfg.final_logit_softcapping)
