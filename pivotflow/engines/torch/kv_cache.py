"""The forward pass that serves from the slot KV cache (``slot_cache.SlotKVCache``, or one per
key shape: ``kv_groups``).

``PackedDecoder`` is ``Decoder.forward`` specialised for that cache: q/k/v and gate/up each run
as one matmul over packed weights, residual adds are fused into the output matmuls, rotary
embeddings come from a table, and decode attention is two batched matmuls over whole slots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F

from pivotflow.engines.torch.attention import Attention, eager_attention, soft_cap
from pivotflow.engines.torch.deltanet_serving import PackedDeltaNet
from pivotflow.engines.torch.experts import PackedExperts, RoutingRecorder
from pivotflow.engines.torch.feedforward import MLP, activation
from pivotflow.engines.torch.kv_groups import ServingCache
from pivotflow.engines.torch.latent_attention import LatentAttention, PackedLatent
from pivotflow.engines.torch.linear import Linears, pack_linears, pack_mlp
from pivotflow.engines.torch.mamba2_serving import PackedMamba2
from pivotflow.engines.torch.model import Decoder, DecoderLayer, embed_scale, sparse_block
from pivotflow.engines.torch.rope import packed_rope_table, turn_partners
from pivotflow.engines.torch.short_conv import PackedShortConv

_T = torch.Tensor
# A dense MLP's [out, in] weights for PackedDecoder (packed gate/up, down); a sparse layer is a
# PackedExperts.
_Dense = tuple[_T, _T]
# One layer for PackedDecoder: (norm weights, q/k/v bias, [out, in] weights q/k/v and o, o bias,
# Qwen3's q/k norm weights, the feed-forward: None in Nemotron-H's mixer blocks; the norms and
# weights of its MLP blocks' mixer half are unused)
_Packed = tuple[
    tuple[_T, _T], _T | None, tuple[_T, _T], _T | None, tuple[_T, _T] | None,
    _Dense | PackedExperts | None
]


class PackedDecoder:
    """``model``'s forward pass specialised for serving from a ``SlotKVCache`` (or
    ``kv_groups.LayerGroupsKVCache``: ``ServingCache``): ``prefill``
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
        self._sinks = [layer.self_attn.sinks if hasattr(layer, "self_attn") else None
                       for layer in cast(list[DecoderLayer], model.model.layers)]
        self.experts: list[PackedExperts] = []  # the sparse layers, in order
        self._moe: list[PackedExperts | None] = []  # (per layer: Gemma 4's beside its MLP)
        # the norms of layers that normalise sub-layer outputs (_output_norm_layer), per layer
        self._out_norms: list[tuple[_T | None, _T, _T | None, _T] | None] = []
        self._post: list[bool] = []  # (per layer: whether it reads _out_norms)
        # the gated MLPs' activation; an ungated dense MLP's is its own (Apertus's xIELU has
        # learned scalars in each layer: the MLP's ``act`` calls them)
        self._act = activation("silu" if cfg.hidden_act == "xielu" else cfg.hidden_act)
        self._mlp_acts = [mlp.act if isinstance(mlp := getattr(layer, "mlp", None), MLP)
                          else self._act
                          for layer in cast(list[DecoderLayer], model.model.layers)]
        # each layer's latent attention projections (DeepSeek-V3's), or None
        self._latent: list[PackedLatent | None] = []
        # each layer's gated DeltaNet (Qwen3.5's linear layers), Mamba2 (Granite 4.0-H's) or
        # short convolution (LFM2's), or None
        self._linear: list[PackedDeltaNet | PackedMamba2 | PackedShortConv | None] = []
        for i, layer in enumerate(cast(list[DecoderLayer], model.model.layers)):
            linear: PackedDeltaNet | PackedMamba2 | PackedShortConv | None = None
            if layer.linear:
                index = cfg.linear_attention_layers.index(i)
                linear = (PackedShortConv(layer.conv, index) if cfg.short_conv
                          else PackedMamba2(layer.mamba, index) if cfg.mamba
                          else PackedDeltaNet(layer.linear_attn, index))
            self._linear.append(linear)
            if not layer.has_mixer:  # (Nemotron-H's MLP blocks: an MLP alone)
                self._latent.append(None)
                self._post.append(False)
                self._out_norms.append(None)
                norm = layer.post_attention_layernorm.weight
                self.layers.append(((norm, norm), None, (norm, norm), None, None,
                                    self._feedforward(layer)))
                continue
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
                # (Gemma 4's full layers: q and k alone, their values k's projection; its
                # KV-sharing layers: q alone)
                own = [attn.q_proj, *([attn.k_proj] if hasattr(attn, "k_proj") else []),
                       *([attn.v_proj] if hasattr(attn, "v_proj") else [])]
                w_qkv, b_qkv = pack_linears(own)
            # (input, post-attention): what pre-norm layers read; the others read _out_norms
            # (Nemotron-H's mixer blocks: no second norm, read as their first)
            second = getattr(layer, "post_attention_layernorm", None) or layer.input_layernorm
            norms = (getattr(layer, "input_layernorm", second).weight, second.weight)
            self._post.append(cfg.is_post_norm(i) or cfg.sandwich_norm)
            if self._post[-1]:  # (input, attention out, MLP in, MLP out)
                self._out_norms.append((
                    layer.input_layernorm.weight if cfg.sandwich_norm else None,
                    layer.post_attention_layernorm.weight,
                    layer.pre_feedforward_layernorm.weight if cfg.sandwich_norm else None,
                    layer.post_feedforward_layernorm.weight))  # fmt: skip
            else:
                self._out_norms.append(None)
            qk_norms = None
            if attn is not None and attn.q_norm is not None:
                # (a KV-sharing layer has no k rows: its k norm is never read)
                qk_norms = (attn.q_norm.weight,
                            (attn.k_norm or attn.q_norm).weight)
            out_proj = linear.module.out_proj if linear else attn.o_proj  # type: ignore[union-attr]
            self.layers.append((norms, b_qkv, (w_qkv, out_proj.weight), out_proj.bias, qk_norms,
                                self._feedforward(layer)))
        layers = range(cfg.num_hidden_layers)
        # each layer's (key/value heads, head width): Gemma 4's full layers' their own
        self._shapes = [cfg.layer_cache_shape(i) for i in layers]
        # each layer's keys' and values' layer (its own, or a Gemma 4 KV-sharing layer's
        # source), the layers others read, and what each of those attended over this pass
        self._sources = [cfg.kv_source(i) for i in layers]
        self._read = {src for i, src in enumerate(self._sources) if src != i}
        self._seen: dict[int, tuple[_T, _T, _T | None]] = {}
        # Gemma 4's: each layer's output scalar, or None
        self._scalars = [getattr(layer, "layer_scalar", None)
                         for layer in cast(list[DecoderLayer], model.model.layers)]
        # one rotary table per rope kind (ModelConfig.rope_kind: full; sliding; none), its
        # layers' head shape, and each rotary dimension's partner for _turned
        self._rope_kinds = [cfg.rope_kind(i) for i in layers]
        self._mixes = [cfg.has_mixer(i) for i in layers]
        weight = model.lm_head.weight
        shapes = {self._rope_kinds[i]: self._shapes[i] for i in layers}
        self._ropes = {k: packed_rope_table(cfg, k, max_len, d, (self.heads, kv), weight.device,
                                            weight.dtype)
                       for k, (kv, d) in shapes.items()}
        self._partner = {k: turn_partners(cfg, d, weight.device, cfg.kind_rotary_dim(k))
                         for k, (_, d) in shapes.items()}

    def _feedforward(self, layer: DecoderLayer) -> _Dense | PackedExperts | None:
        """A layer's MLP packed (a sparse one's experts stacked), None where it has none;
        Gemma 4's experts beside its MLP packed into ``_moe``."""
        self._moe.append(None)
        if not layer.has_mlp:
            return None
        block = sparse_block(layer)
        if block is not None:
            shared = block.shared_experts or block.shared_expert
            ffn = PackedExperts(block, self.mm, len(self.experts),
                                None if shared is None else pack_mlp(shared))
            self.experts.append(ffn)
            if block is not layer.mlp:
                self._moe[-1] = ffn
                return pack_mlp(cast(MLP, layer.mlp))
            return ffn
        return pack_mlp(cast(MLP, layer.mlp))

    def _turned(self, qk: torch.Tensor, i: int) -> torch.Tensor:
        """Each head's dimensions moved onto their rotate_half partners (signs in the table),
        in layer ``i``."""
        partner = self._partner[self._rope_kinds[i]]
        if partner is None:
            return qk.roll(qk.shape[-1] // 2, -1)
        return qk.index_select(-1, partner)

    def record_routing(self, recorder: RoutingRecorder | None) -> None:
        """Record every sparse layer's expert choices into ``recorder`` (None: stop)."""
        for experts in self.experts:
            experts.recorder = recorder

    def prefill(self, ids: torch.Tensor, last: torch.Tensor, cache: ServingCache) -> torch.Tensor:
        """Logits [B, vocab] at positions ``last`` [B] of right-padded prompts ``ids`` [B, T],
        after ``cache.begin_prefill``."""
        b, t = ids.shape
        ropes = {k: table[None, :t] for k, table in self._ropes.items()}
        x = self._layers(ids, ropes, self._attend_prompt, cache).view(b, t, -1)
        return self._logits(x[torch.arange(b, device=ids.device), last])

    def decode(
        self, tokens: torch.Tensor, positions: torch.Tensor, cache: ServingCache
    ) -> torch.Tensor:
        """Logits [n, vocab] for ``tokens`` [n] at ``positions`` [n] (from ``begin_decode``)."""
        ropes = {k: table[positions][:, None] for k, table in self._ropes.items()}
        return self._logits(self._layers(tokens[:, None], ropes, self._attend_decode, cache))

    def _layers(
        self,
        tokens: torch.Tensor,
        ropes: dict[str, torch.Tensor],
        attend: Callable[[int, torch.Tensor, torch.Tensor, ServingCache], torch.Tensor],
        cache: ServingCache,
    ) -> torch.Tensor:
        """Hidden states [B * T, hidden] after the decoder layers, for token ids [B, T] with
        rotary tables [B or 1, T, 2, heads + kv_heads, D] per rope kind (``ropes[kind]``)."""
        cfg, mm = self.cfg, self.mm
        hidden, eps, inter = (cfg.hidden_size,), cfg.rms_norm_eps, cfg.intermediate_size
        b, t = tokens.shape
        x = self.model.model.embed_tokens.weight[tokens.view(-1)]
        if cfg.embed_scaled:
            x = x * embed_scale(cfg, x.dtype)
        elif cfg.embedding_multiplier != 1.0:  # (Granite's)
            x = x * cfg.embedding_multiplier
        per_layer = (self.model.model.per_layer_inputs(tokens.view(-1), x)
                     if cfg.hidden_size_per_layer_input else None)  # (Gemma 4 E2B's, E4B's)
        scaled = cfg.residual_multiplier != 1.0  # (Granite's: sub-layer outputs scaled)
        offset = cfg.norm_offset
        for i, ((norm1, norm2), _, _, _, _, ffn) in enumerate(self.layers):
            rope = ropes[self._rope_kinds[i]]
            if self._post[i]:
                x = self._output_norm_layer(i, x, (b, t), rope, cache, attend,
                                            None if per_layer is None else per_layer[:, i])
                continue
            # (Cohere 2's MLP reads the layer's input, normed as its attention does)
            mlp_in = self._norm(x, norm1) if cfg.parallel_block else None
            if self._mixes[i]:
                x = self._mixer_half(i, x, (b, t), rope, cache, attend)
            if isinstance(ffn, PackedExperts):  # (Granite 4.0's scaled as a dense MLP's)
                h = torch.rms_norm(x, hidden, norm2 + 1 if offset else norm2, eps)
                x = (x + ffn.add(h, torch.zeros_like(x)) * cfg.residual_multiplier if scaled
                     else ffn.add(h, x))
            elif ffn is not None:
                h = self._norm(x, norm2) if mlp_in is None else mlp_in
                w_gate_up, w_down = ffn
                gated = (mm.gated(h, w_gate_up, inter) if cfg.mlp_gated
                         else self._mlp_acts[i](mm.linear(h, w_gate_up)))  # (Nemotron-H's: no gate)
                x = (x + mm.linear(gated, w_down) * cfg.residual_multiplier if scaled
                     else mm.linear_add(gated, w_down, None, x))
        return x

    def _mixer_half(
        self,
        i: int,
        x: torch.Tensor,
        shape: tuple[int, int],
        rope: torch.Tensor,
        cache: ServingCache,
        attend: Callable[[int, torch.Tensor, torch.Tensor, ServingCache], torch.Tensor],
    ) -> torch.Tensor:
        """A pre-norm layer's first half on hidden states [B * T, hidden]: ``x`` plus its
        attention's (or linear mixer's) output for its normed input."""
        cfg, heads, mm, (b, t) = self.cfg, self.heads, self.mm, shape
        kv_heads, d = self._shapes[i]
        (norm1, _), b_qkv, (w_qkv, w_o), b_o, qk_norms, _ = self.layers[i]
        split = (heads + kv_heads) * d
        cos, sin = rope[:, :, 0], rope[:, :, 1]
        h = self._norm(x, norm1)  # (Qwen3.5's norms scale by 1 + weight, Cohere 2's LayerNorm)
        latent, linear, gate = self._latent[i], self._linear[i], None
        if linear is not None:  # (a gated DeltaNet or Mamba2: a state, no keys or values)
            out = self._linear_layer(linear, h, (b, t), cache)
        elif latent is not None:  # (DeepSeek-V3's: per-head q/k/v from its latents)
            qk, v = latent.qkv(h, mm)
            qk = qk.view(b, t, -1, d)
            qk = torch.addcmul(qk * cos, self._turned(qk, i), sin).view(b * t, -1, d)
            out = latent.output(attend(i, qk, v, cache))
        else:
            qkv = mm.linear(h, w_qkv, b_qkv)
            if qk_norms is not None and cfg.whole_qk_norm:  # (OLMoE's: before the heads)
                self._whole_qk_norm(qkv, qk_norms)
            if cfg.attn_output_gate:  # (Qwen3.5's: q and gate interleaved by head)
                qkv, gate = self._gate_split(qkv, d)
            qk = qkv[:, :split].view(b, t, heads + kv_heads, d)
            per_head = None if cfg.whole_qk_norm else qk_norms
            if per_head is not None and not cfg.qk_norm_after_rope:  # (Qwen3's: before RoPE)
                qk = self._head_norms(qk, per_head)
            if cfg.weightless_qk_norm and self._rope_kinds[i] != "none":  # (Llama 4's)
                qk = torch.rms_norm(qk.float(), (d,), None, cfg.rms_norm_eps).to(qk.dtype)
            qk = torch.addcmul(qk * cos, self._turned(qk, i), sin)
            if per_head is not None and cfg.qk_norm_after_rope:
                # (Hunyuan's: after it, q's scaled by the score scale there, which a rope
                # table before a norm cannot carry)
                qk = self._head_norms(qk, per_head, cfg.attention_scale)
            qk = qk.view(b * t, -1, d)
            out = attend(i, qk, self._values(i, qkv), cache)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        if cfg.residual_multiplier != 1.0:  # (Granite's: sub-layer outputs scaled)
            return x + mm.linear(out, w_o, b_o) * cfg.residual_multiplier
        return mm.linear_add(out, w_o, b_o, x)

    def _output_norm_layer(
        self,
        i: int,
        x: torch.Tensor,
        shape: tuple[int, int],
        rope: torch.Tensor,
        cache: ServingCache,
        attend: Callable[[int, torch.Tensor, torch.Tensor, ServingCache], torch.Tensor],
        per_layer: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Layer ``i`` of the families that normalise each sub-layer's output before its
        residual add, on hidden states [B * T, hidden]. OLMo-2/3 (post-norm): nothing on the
        inputs, q and k RMS-normalised over their whole projections. Gemma 3, GLM-4 and AFMoE
        (sandwich): the inputs normalised too; Gemma's q and k per head, every norm scaling by
        1 + weight, the MLP gated by tanh-GELU (``self._act``); AFMoE's attention output gated
        (its gate inside q_proj, as Qwen3.5's) and its sparse layers' experts. Gemma 4's
        KV-sharing layers project queries alone; its ``per_layer`` inputs [B * T, width] gate
        a branch after the MLP."""
        _, b_qkv, (w_qkv, w_o), b_o, qk_norms, ffn = self.layers[i]
        norms = self._out_norms[i]
        assert norms is not None
        norm_in, norm_attn, norm_mlp_in, norm_mlp = norms
        heads, mm, (b, t) = self.heads, self.mm, shape
        kv_heads, d = self._shapes[i]
        if self._sources[i] != i:  # (no keys or values of its own: queries alone)
            kv_heads, rope = 0, rope[..., :heads, :]
        hidden, eps, split = (self.cfg.hidden_size,), self.cfg.rms_norm_eps, (heads + kv_heads) * d
        offset = self.cfg.norm_offset

        def norm(h: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
            if weight is None:  # (post-norm: no norm on a sub-layer's input)
                return h
            return torch.rms_norm(h, hidden, weight + 1 if offset else weight, eps)

        qkv, gate = mm.linear(norm(x, norm_in), w_qkv, b_qkv), None
        if qk_norms is not None and self.cfg.whole_qk_norm:  # (OLMo's: before the heads)
            self._whole_qk_norm(qkv, qk_norms)
        if self.cfg.attn_output_gate:  # (AFMoE's)
            qkv, gate = self._gate_split(qkv, d)
        qk = qkv[:, :split].view(b, t, heads + kv_heads, d)
        if qk_norms is not None and not self.cfg.whole_qk_norm:  # each head, by 1 + weight
            qk = self._head_norms(qk, qk_norms)
        qk = torch.addcmul(qk * rope[:, :, 0], self._turned(qk, i), rope[:, :, 1])
        out = attend(i, qk.view(b * t, -1, d), self._values(i, qkv), cache)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        x = x + norm(mm.linear(out, w_o, b_o), norm_attn)
        if isinstance(ffn, PackedExperts):  # (AFMoE's sparse layers)
            return x + norm(ffn.add(norm(x, norm_mlp_in), torch.zeros_like(x)), norm_mlp)
        w_gate_up, w_down = cast(_Dense, ffn)  # (Gemma 4's may be twice as wide)
        h = mm.gated(norm(x, norm_mlp_in), w_gate_up, w_gate_up.shape[0] // 2, self._act)
        h = mm.linear(h, w_down)
        moe = self._moe[i]
        if moe is not None:  # (Gemma 4's experts beside the MLP, routed from x)
            layer = cast(DecoderLayer, self.model.model.layers[i])
            experts = moe.add(norm(x, layer.pre_feedforward_layernorm_2.weight),
                              torch.zeros_like(x), x)
            h = (norm(h, layer.post_feedforward_layernorm_1.weight)
                 + norm(experts, layer.post_feedforward_layernorm_2.weight))
        x = x + norm(h, norm_mlp)
        if per_layer is not None:
            layer = cast(DecoderLayer, self.model.model.layers[i])
            h = self._act(mm.linear(x, layer.per_layer_input_gate.weight)) * per_layer
            x = x + norm(mm.linear(h, layer.per_layer_projection.weight),
                         layer.post_per_layer_input_norm.weight)
        scalar = self._scalars[i]  # (Gemma 4's: the whole layer's output scaled)
        return x if scalar is None else x * scalar

    def _values(self, i: int, qkv: torch.Tensor) -> torch.Tensor:
        """Layer ``i``'s value heads [rows, kv heads, D] from its projected rows ``qkv`` (q|k|v,
        or q|k where the values are k's projection, Gemma 4's full layers), normalised
        without a scale where the family says (Gemma 4's)."""
        kv_heads, d = self._shapes[i]
        if self._sources[i] != i:  # (a KV-sharing layer's: its source's, kept by attend)
            return qkv.new_empty(qkv.shape[0], 0, d)
        v = qkv[:, -kv_heads * d:].view(qkv.shape[0], kv_heads, d)
        if not self.cfg.value_norm:
            return v
        return torch.rms_norm(v.float(), (d,), None, self.cfg.rms_norm_eps).to(v.dtype)

    def _linear_layer(self, linear: PackedDeltaNet | PackedMamba2 | PackedShortConv, h: torch.Tensor,
                      shape: tuple[int, int], cache: ServingCache) -> torch.Tensor:
        """A linear layer's output (out_proj's input) for rows ``h``, its states in
        ``cache``: a prefill's prompts or a decode step's tokens."""
        assert cache.states is not None
        if cache.prefilling:
            start, lengths = cache.prefill_slots
            return linear.prefill(h, shape, lengths, start, cache.states, self.mm)
        return linear.decode(h, cache.states, self.mm)

    def _gate_split(self, qkv: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Qwen3.5's gated attention: q_proj's rows [head 0's query, its gate, head 1's...]
        then k, v -> (q|k|v [rows, (heads + 2 kv_heads) * D], gate [rows, heads * D]), heads
        of width ``d``."""
        rows, heads = qkv.shape[0], self.heads
        q_gate = qkv[:, :2 * heads * d].view(rows, heads, 2, d)
        gate = q_gate[:, :, 1].reshape(rows, heads * d)
        return torch.cat((q_gate[:, :, 0].reshape(rows, heads * d), qkv[:, 2 * heads * d:]),
                         -1), gate

    def _head_norms(self, qk: torch.Tensor, qk_norms: tuple[_T, _T],
                    q_scale: float = 1.0) -> torch.Tensor:
        """Every head of q (of k) in ``qk`` [B, T, heads + kv heads, D] through its one
        RMSNorm: all heads normalised at once, then q's and k's scaled by their own weights
        (by 1 + weight where the family's norms are offset), q's also by ``q_scale`` (the
        score scale, where the rope table cannot carry it: ``packed_rope_table``)."""
        heads, offset = self.heads, int(self.cfg.norm_offset)
        if self.cfg.centered_norm:  # (Command R+'s LayerNorms: each head's mean removed)
            qk = qk - qk.mean(-1, keepdim=True)
        qk = torch.rms_norm(qk, (qk.shape[-1],), None, self.cfg.rms_norm_eps)
        qk[:, :, :heads].mul_((qk_norms[0] + offset) * q_scale if q_scale != 1.0
                              else qk_norms[0] + offset)
        qk[:, :, heads:].mul_(qk_norms[1] + offset)
        return qk

    def _whole_qk_norm(self, qkv: torch.Tensor, qk_norms: tuple[_T, _T]) -> None:
        """q and k RMS-normalised over their whole projections (OLMo-2/3's, OLMoE's), in place
        in the rows of ``qkv`` [n, (heads + 2 kv_heads) * D]."""
        q_width, split = self.heads * self.d, (self.heads + self.kv_heads) * self.d
        eps = self.cfg.rms_norm_eps
        qkv[:, :q_width] = torch.rms_norm(qkv[:, :q_width], (q_width,), qk_norms[0], eps)
        qkv[:, q_width:split] = torch.rms_norm(qkv[:, q_width:split], (split - q_width,),
                                               qk_norms[1], eps)

    def _attend_decode(
        self, layer: int, qk: torch.Tensor, v: torch.Tensor, cache: ServingCache
    ) -> torch.Tensor:
        """Roped queries+keys [n, heads + kv_heads, D], values [n, kv_heads, D] -> [n, heads*D]."""
        n, heads, (kv_heads, d) = qk.shape[0], self.heads, self._shapes[layer]
        keys, values, mask = self._keys(layer, qk, v, cache)
        assert mask is not None  # (a decode step's: the slots' unused tails hidden)
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
        self, layer: int, qk: torch.Tensor, v: torch.Tensor, cache: ServingCache
    ) -> torch.Tensor:
        """The same over [B * T] rows of right-padded prompts, causal within each."""
        (b, t), heads, (kv_heads, d) = cache.prefill_shape, self.heads, self._shapes[layer]
        qk = qk.view(b, t, -1, d).transpose(1, 2)
        v = v.view(b, t, v.shape[-2], d).transpose(1, 2)
        keys, values, mask = self._keys(layer, qk, v, cache)
        if self.cfg.attn_logit_softcapping or self.cfg.attention_sinks:
            rep = heads // kv_heads
            out = eager_attention(
                qk[:, :heads], keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1),
                mask, 1.0, self.cfg.attn_logit_softcapping, self._sinks[layer])
        else:
            out = F.scaled_dot_product_attention(
                qk[:, :heads], keys, values, mask, is_causal=mask is None, scale=1.0,
                enable_gqa=True)
        return out.transpose(1, 2).reshape(b * t, heads * d)

    def _keys(self, layer: int, qk: torch.Tensor, v: torch.Tensor, cache: ServingCache
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The keys, values and mask attention layer ``layer`` reads: its new ones (the key
        rows of ``qk`` past the queries, ``v``) stored in the cache as a prefill
        ([B, heads + kv heads, T, D]) or a decode step ([n, heads + kv heads, D]) stores
        them, and kept for the layers that share them (Gemma 4's); a KV-sharing layer's, its
        source's, as they were kept."""
        source = self._sources[layer]
        if source != layer:
            return self._seen[source]
        heads = self.heads
        if cache.prefilling:
            seen = cache.update(layer, qk[:, heads:], v)
        else:  # (latent attention: the cache keeps keys alone, its values their latent part)
            seen = cache.append(layer, qk[:, heads:] if self._latent[layer] is not None
                                else torch.cat((qk[:, heads:], v), 1))
        if layer in self._read:
            self._seen[layer] = seen
        return seen

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Hidden states [rows, hidden] through a layer norm of the family's kind: RMSNorm by
        ``weight`` (by 1 + weight: Gemma's, Qwen3.5's), or Cohere 2's LayerNorm."""
        hidden, eps = (self.cfg.hidden_size,), self.cfg.rms_norm_eps
        if self.cfg.centered_norm:
            return torch.layer_norm(x, hidden, weight, None, eps)
        return torch.rms_norm(x, hidden, weight + 1 if self.cfg.norm_offset else weight, eps)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        h = self._norm(x, self.model.model.norm.weight)
        logits = self.mm.linear(h, self.model.lm_head.weight)
        if self.cfg.logits_scaling != 1.0:  # (Granite's)
            logits = logits / self.cfg.logits_scaling
        return soft_cap(logits, self.cfg.final_logit_softcapping)
