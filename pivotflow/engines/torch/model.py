"""A Llama/Mistral/Qwen2/Qwen3/Qwen3-MoE/OLMo/Gemma-style decoder in plain PyTorch, and the
families ``model_config.ARCHITECTURES`` names that differ from these in little.

Module and parameter names follow Hugging Face's checkpoints exactly (``model.layers.0
.self_attn.q_proj.weight``, ``model.layers.0.mlp.experts.3.up_proj.weight`` ...), so a state dict
saved by ``transformers`` loads with ``load_state_dict`` unchanged, and ours loads in
``transformers``. The families differ in little: Qwen2 has q/k/v biases; Llama and Qwen3 have
biases on all four attention projections only when ``attention_bias`` says so; Mistral is Llama
without biases; Qwen3 RMS-normalises each head of q and k before RoPE; Qwen3-MoE is Qwen3 with a
routed mixture of experts in place of the MLP on its sparse layers (``SparseMoE``); OLMo-2 normalises the whole q and k projections
(not each head) and puts its layer norms after attention and the MLP, on their outputs, before
each residual add, instead of on their inputs (no ``input_layernorm``); OLMo-3 is OLMo-2 with
sliding windows; Gemma 3 (text) norms both inputs and outputs ("sandwich"), scales its norms by
``1 + weight``, its embeddings by sqrt(hidden) and its attention by ``query_pre_attn_scalar``,
and gates its MLP with tanh-GELU; Gemma 2 is Gemma 3 without q/k norms, with soft-capped
scores and logits (``attention.eager_attention``, ``LMHead``); GLM-4.5 (``glm4_moe``) is
Llama's layer with half of each head rotating and, past its first dense layers, a
sigmoid-routed mixture of experts with a shared expert; SmolLM3 leaves rope out of some layers; Granite scales
embeddings, sub-layer outputs, scores and logits (Granite 4.0-H: Mamba2 on most layers, no rope,
a shared MLP beside its experts); gpt-oss adds a learned sink to each head's
softmax and biased, clamped experts (``feedforward``); DeepSeek-V3 attends through latents
(``LatentAttention``) and routes as GLM-4.5; Gemma 4 (``hf_gemma4``) gives its full layers
heads of their own width and count (values equal to keys where it says), normalises values,
scales each layer's output, and may feed each layer an input of its own, share keys and values
between layers (``Attention.forward``'s ``shared``) and route to experts beside its MLP
(``DecoderLayer.moe``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from pivotflow.engines.torch.attention import Attention, soft_cap
from pivotflow.engines.torch.feedforward import MLP, XIELU, LoadBalance, SparseMoE
from pivotflow.engines.torch.gated_deltanet import GatedDeltaNet
from pivotflow.engines.torch.latent_attention import LatentAttention
from pivotflow.engines.torch.layers import KVCacheHook, layer_norm
from pivotflow.engines.torch.mamba2 import Mamba2
from pivotflow.engines.torch.model_config import ModelConfig
from pivotflow.engines.torch.rope import layer_cos_sin, query_scale
from pivotflow.engines.torch.short_conv import ShortConv


class DecoderLayer(nn.Module):
    """Pre-norm (Llama's): ``x + attn(norm(x))``, then ``x + mlp(norm(x))``; post-norm
    (OLMo's): ``x + norm(attn(x))``, then ``x + norm(mlp(x))``; sandwich (Gemma's, GLM-4's):
    ``x + norm(attn(norm(x)))``, then ``x + norm(mlp(norm(x)))``; under the Hub's names
    (``post_attention_layernorm`` is the second norm of every kind). Sliding-window layers
    differ only in the mask and rope table ``Decoder.hidden_states`` hands them."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.post_norm, self.sandwich = cfg.is_post_norm(layer_idx), cfg.sandwich_norm
        # Gemma 4's: the layer's output times a constant of the checkpoint (a buffer in
        # transformers: held frozen, ``Decoder.requires_grad_``)
        if cfg.layer_scalars:
            self.layer_scalar = nn.Parameter(torch.ones(1), requires_grad=False)
        self.residual = cfg.residual_multiplier  # (Granite's: each sub-layer's output scaled)
        size = cfg.hidden_size
        # (Nemotron-H's layers are one block: a mixer alone, or an MLP alone)
        self.has_mixer, self.has_mlp = cfg.has_mixer(layer_idx), cfg.has_mlp(layer_idx)
        if not self.post_norm and self.has_mixer:
            self.input_layernorm = layer_norm(cfg, size)
        # (Qwen3.5's linear layers: ``linear_attn`` in place of ``self_attn``, Granite 4.0-H's
        # ``mamba``, as HF names them)
        self.linear = cfg.is_linear(layer_idx)
        if self.linear and cfg.short_conv:
            self.conv = ShortConv(cfg)
        elif self.linear and cfg.mamba:
            self.mamba = Mamba2(cfg)
        elif self.linear:
            self.linear_attn = GatedDeltaNet(cfg)
        elif self.has_mixer:
            self.self_attn: Attention | LatentAttention = (
                LatentAttention(cfg, layer_idx) if cfg.latent_attention
                else Attention(cfg, layer_idx))
        self.parallel = cfg.parallel_block  # (Cohere 2's: one norm, read by both halves)
        if not self.has_mlp:
            return
        if not self.parallel:
            self.post_attention_layernorm = layer_norm(cfg, size)
        if self.sandwich:
            self.pre_feedforward_layernorm = layer_norm(cfg, size)
        beside = cfg.experts_beside_mlp  # (Gemma 4's: experts beside its dense MLP)
        self.mlp: nn.Module = (SparseMoE(cfg) if cfg.is_sparse(layer_idx) and not beside
                               else MLP(cfg, cfg.layer_intermediate(layer_idx)))
        if beside and cfg.is_sparse(layer_idx):
            self.moe = SparseMoE(cfg)
            self.post_feedforward_layernorm_1 = layer_norm(cfg, size)
            self.pre_feedforward_layernorm_2 = layer_norm(cfg, size)
            self.post_feedforward_layernorm_2 = layer_norm(cfg, size)
        if cfg.hidden_size_per_layer_input:  # (Gemma 4 E2B's and E4B's per-layer inputs)
            width = cfg.hidden_size_per_layer_input
            self.per_layer_input_gate = nn.Linear(size, width, bias=False)
            self.per_layer_projection = nn.Linear(width, size, bias=False)
            self.post_per_layer_input_norm = layer_norm(cfg, size)
        if self.post_norm or self.sandwich:
            self.post_feedforward_layernorm = layer_norm(cfg, size)

    @property
    def mixer(self) -> GatedDeltaNet | Mamba2 | ShortConv:
        """A linear layer's state-keeping mixer (its gated DeltaNet, Mamba2 or short
        convolution)."""
        for name in ("mamba", "conv"):
            if hasattr(self, name):
                return getattr(self, name)  # type: ignore[no-any-return]
        return self.linear_attn

    def forward(self, x, cos, sin, attn_mask, cache, replay=None, balance=None,  # type: ignore[no-untyped-def]
                q_scale=None, shared=None, per_layer=None):
        """``shared``: Gemma 4's keys and values by layer (``Attention.forward``);
        ``per_layer`` [B, T, width]: its per-layer input for this layer."""
        if self.sandwich:  # Gemma, GLM-4, AFMoE: each sub-layer's input and output normalised
            attn = self.self_attn(self.input_layernorm(x), cos, sin, attn_mask, cache,
                                  shared=shared)
            x = x + self.post_attention_layernorm(attn)
            h = self.pre_feedforward_layernorm(x)
            h = self.mlp(h, replay, balance) if isinstance(self.mlp, SparseMoE) else self.mlp(h)
            if hasattr(self, "moe"):  # (Gemma 4's experts beside the MLP, routed from x)
                experts = self.moe(self.pre_feedforward_layernorm_2(x), replay, balance, x)
                h = (self.post_feedforward_layernorm_1(h)
                     + self.post_feedforward_layernorm_2(experts))
            x = x + self.post_feedforward_layernorm(h)
            if per_layer is not None:  # (Gemma 4's: a branch its per-layer input gates)
                h = self.mlp.act(self.per_layer_input_gate(x)) * per_layer
                x = x + self.post_per_layer_input_norm(self.per_layer_projection(h))
            return x * self.layer_scalar if hasattr(self, "layer_scalar") else x
        if self.parallel:  # (Cohere 2's: attention and the MLP side by side)
            h = self.input_layernorm(x)
            return x + self.self_attn(h, cos, sin, attn_mask, cache) + self.mlp(h)
        if self.post_norm:
            x = x + self.post_attention_layernorm(self.self_attn(x, cos, sin, attn_mask, cache))
            return x + self.post_feedforward_layernorm(self.mlp(x))
        if self.has_mixer:
            h = self.input_layernorm(x)
            attn = (self.mixer(h) if self.linear  # (q_scale: Ministral 3's, a pre-norm layer)
                    else self.self_attn(h, cos, sin, attn_mask, cache, q_scale))
            x = x + (attn * self.residual if self.residual != 1.0 else attn)
        if not self.has_mlp:
            return x
        h = self.post_attention_layernorm(x)
        out = self.mlp(h, replay, balance) if isinstance(self.mlp, SparseMoE) else self.mlp(h)
        return x + (out * self.residual if self.residual != 1.0 else out)


class LMHead(nn.Linear):
    """The causal LM's head (``lm_head.weight``): logits, divided by ``divisor`` (Granite's
    ``logits_scaling``) and soft-capped (Gemma 2's ``final_logit_softcapping``; ``cap`` 0:
    none) when the config says so, so every caller of ``model.lm_head`` (the trainer's scoring
    included) gets the logits transformers gives."""

    def __init__(self, hidden: int, vocab: int, cap: float = 0.0, divisor: float = 1.0) -> None:
        super().__init__(hidden, vocab, bias=False)
        self.cap, self.divisor = cap, divisor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        return soft_cap(logits / self.divisor if self.divisor != 1.0 else logits, self.cap)


class _Backbone(nn.Module):
    """Holds the ``model.*`` tensors under HF's names."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = layer_norm(cfg, cfg.hidden_size)
        if cfg.hidden_size_per_layer_input:  # (Gemma 4 E2B's and E4B's per-layer inputs)
            width = cfg.num_hidden_layers * cfg.hidden_size_per_layer_input
            self.embed_tokens_per_layer = nn.Embedding(cfg.vocab_size_per_layer_input, width)
            self.per_layer_model_projection = nn.Linear(cfg.hidden_size, width, bias=False)
            self.per_layer_projection_norm = layer_norm(cfg, cfg.hidden_size_per_layer_input)

    def per_layer_inputs(self, ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """Gemma 4's per-layer inputs [..., layers, width] for token ids [...] and their
        scaled input embeddings [..., hidden]: each token's own per-layer embedding (times
        sqrt(width)) and a normalised projection of its input embedding (times
        hidden ** -0.5), averaged by 1 / sqrt(2), as transformers computes them."""
        width = self.per_layer_projection_norm.weight.shape[0]
        table = self.embed_tokens_per_layer.weight
        own = table[ids] * torch.tensor(width**0.5, dtype=table.dtype)
        mixed = self.per_layer_model_projection(embeds) * embeds.shape[-1] ** -0.5
        mixed = self.per_layer_projection_norm(mixed.view(*mixed.shape[:-1], -1, width))
        return (mixed + own.view(mixed.shape)) * 2**-0.5


class Decoder(nn.Module):
    """The causal LM. ``forward(ids)`` gives logits [B, T, V].

    Training and scoring call it with ``attention_mask`` [B, T] (1 = real token) for right-padded
    batches; the engine passes ``positions`` and a ``cache`` for incremental decoding.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg.validate()
        # (verl's enable_gradient_checkpointing, HF's gradient_checkpointing_enable(): set by the
        # trainer from its gradient_checkpointing knob; inference never recomputes)
        self.gradient_checkpointing = False
        self.model = _Backbone(cfg)
        if cfg.num_labels:  # a classifier's head, as transformers names it (no lm_head)
            self.score = nn.Linear(cfg.hidden_size, cfg.num_labels, bias=False)
        else:
            self.lm_head = LMHead(cfg.hidden_size, cfg.vocab_size, cfg.final_logit_softcapping,
                                  cfg.logits_scaling)
            if cfg.tie_word_embeddings:
                self.lm_head.weight = self.model.embed_tokens.weight
        if not self.model.norm.weight.is_meta:  # on meta, weights are loaded next: no init
            self.apply(self._init_weights)

    def requires_grad_(self, requires_grad: bool = True) -> Decoder:
        """As nn.Module's, but a sigmoid router's correction bias stays frozen: a load
        statistic (GLM-4.5's), not a weight; no loss has a gradient for it. So do xIELU's
        constants (Apertus's beta and eps: buffers in transformers) and Gemma 4's layer
        scalars (one too)."""
        super().requires_grad_(requires_grad)
        for block in self._sigmoid_routed():
            assert block.correction_bias is not None
            block.correction_bias.requires_grad_(False)
        for module in self.modules():
            if isinstance(module, XIELU):
                module.beta.requires_grad_(False)
                module.eps.requires_grad_(False)
            if isinstance(module, DecoderLayer) and hasattr(module, "layer_scalar"):
                module.layer_scalar.requires_grad_(False)  # (Gemma 4's: a buffer there)
        return self

    def keep_sigmoid_routers_float32(self) -> None:
        """A sigmoid router's weight and correction bias back to float32 in a model of another
        dtype, as transformers (``_keep_in_fp32_modules_strict``) and vLLM hold GLM-4.5's: its
        scores decide which experts run, and a bf16 router's choices would part from theirs."""
        for block in self._sigmoid_routed():
            block.gate.float()

    def _sigmoid_routed(self) -> list[SparseMoE]:
        """The sparse blocks whose router is a sigmoid one (those with a correction bias)."""
        blocks = [sparse_block(layer) for layer in self.model.layers]
        return [b for b in blocks if b is not None and b.correction_bias is not None]

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, cache: KVCacheHook | None = None,
                routing: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.hidden_states(input_ids, attention_mask, positions, cache, routing)
        if self.config.num_labels:  # (a classifier's score head is never capped)
            return self.score(hidden)
        return self.lm_head(hidden)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        cache: KVCacheHook | None = None,
        routing: torch.Tensor | None = None,
        balance: LoadBalance | None = None,
    ) -> torch.Tensor:
        """The final norm's output [B, T, H]: what ``lm_head`` reads (the trainer applies the
        head to the positions it scores only, ``worker/response_scoring.py``). ``routing``
        [B, T, sparse layers, k] replays a rollout's expert choices (-1: the router's own);
        ``balance`` collects every sparse layer's load-balancing terms (under gradient
        checkpointing a layer runs again in the backward pass and adds them again, after the
        loss was taken: harmless)."""
        b, t = input_ids.shape
        if cache is not None and self.config.linear_attention_layers:
            raise ValueError("a hybrid model's linear layers keep a state, not keys and values: "
                             "serve it through kv_cache.PackedDecoder")
        if positions is None:
            positions = torch.arange(t, device=input_ids.device).expand(b, t)
        x = self.model.embed_tokens(input_ids)
        cfg = self.config
        if cfg.embed_scaled:  # Gemma: embeddings times sqrt(hidden), rounded to their dtype
            x = x * embed_scale(cfg, x.dtype)
        elif cfg.embedding_multiplier != 1.0:  # (Granite's)
            x = x * cfg.embedding_multiplier
        # Recomputed per call (a few dozen floats), never stored: HF does not save it either.
        # One mask per kind of layer (full attention, a sliding window's) and one rotary table
        # per rope kind (ModelConfig.rope_kind).
        kinds = {cfg.is_sliding(i) for i in range(cfg.num_hidden_layers)}
        rope = {k: layer_cos_sin(cfg, k, positions, x.dtype)
                for k in {cfg.rope_kind(i) for i in range(cfg.num_hidden_layers)}}
        masks: dict[bool, torch.Tensor | None] = {k: None for k in kinds}
        if cache is None:  # (a cache gives its own: KVCacheHook.update)
            masks = {k: attention_mask_of(t, attention_mask, cfg.sliding_window if k else 0,
                                          x.device, bool(cfg.attention_chunk_size))
                     for k in kinds}  # fmt: skip
        # (Ministral 3's, by position; Llama 4's on its NoPE layers; else None)
        scales = {k: query_scale(cfg, positions, k) for k in rope}
        q_scales = {k: None if s is None else s[:, None, :, None] for k, s in scales.items()}
        recompute = self.gradient_checkpointing and cache is None and torch.is_grad_enabled()
        sparse = 0
        # (Gemma 4's: the keys and values each layer attended over, for the layers that share
        # them; each layer's per-layer inputs)
        shared: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] | None = (
            {} if cfg.num_kv_shared_layers else None)
        per_layer = (self.model.per_layer_inputs(input_ids, x)
                     if cfg.hidden_size_per_layer_input else None)
        for i, layer in enumerate(self.model.layers):
            (cos, sin), mask = rope[cfg.rope_kind(i)], masks[cfg.is_sliding(i)]
            q_scale = q_scales[cfg.rope_kind(i)]
            replay = None
            if routing is not None and sparse_block(layer) is not None:
                replay, sparse = routing[:, :, sparse].long(), sparse + 1
            mine = None if per_layer is None else per_layer[:, :, i]
            if recompute:
                # Activation checkpointing: keep each layer's input only and run the layer again
                # in the backward pass (about one more forward of the stack, for the memory of
                # every layer's intermediates; bench/train_memory.py measures both).
                x = checkpoint(layer, x, cos, sin, mask, None, replay, balance, q_scale, shared,
                               mine, use_reentrant=False)
            else:
                x = layer(x, cos, sin, mask, cache, replay, balance, q_scale, shared, mine)
        return self.model.norm(x)


def sparse_block(layer: nn.Module) -> SparseMoE | None:
    """A decoder layer's routed experts: its ``mlp`` where that is sparse, Gemma 4's ``moe``
    beside it, or None."""
    block = getattr(layer, "moe", None) or getattr(layer, "mlp", None)
    return block if isinstance(block, SparseMoE) else None


def embed_scale(cfg: ModelConfig, dtype: torch.dtype) -> torch.Tensor:
    """Gemma's embedding multiplier: sqrt(hidden_size), as a tensor of the embeddings' dtype
    (transformers rounds it to bf16 in a bf16 model: 2048 ** 0.5 becomes 45.25)."""
    return torch.tensor(cfg.hidden_size**0.5, dtype=dtype)


def attention_mask_of(t: int, attention_mask: torch.Tensor | None, window: int,
                      device: torch.device, chunked: bool = False) -> torch.Tensor | None:
    """The boolean mask [B or 1, 1, t, t] (True: attend) of right-padded sequences: causal,
    key-is-real, and within ``window`` positions when > 0 (key j seen from query i when
    i - window < j; ``chunked``, Llama 4's: within the same chunk of ``window``, j // window
    == i // window). None where plain causal attention is the same (no padding, no window
    shorter than t). A padded query row keeps one key (itself, or key 0 without a window) so
    its softmax stays finite; its output is never read."""
    if attention_mask is None and not 0 < window < t:
        return None
    idx = torch.arange(t, device=device)
    allowed = idx[None, :] <= idx[:, None]
    if 0 < window < t:
        allowed &= (idx[None, :] // window == idx[:, None] // window if chunked
                    else idx[None, :] > idx[:, None] - window)
    mask = allowed[None, None].clone()
    if attention_mask is not None:
        mask = mask & attention_mask.bool()[:, None, None, :]
        if window:
            mask |= torch.eye(t, dtype=torch.bool, device=device)
        else:
            mask[..., 0] = True
    return mask


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position: logits [B, T, V], targets [B, T] -> [B, T] (float32)."""
    return pick_targets(torch.log_softmax(logits.float(), dim=-1), targets)


def pick_targets(logp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each position's target's entry of a log-softmax: [B, T, V], [B, T] -> [B, T]."""
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """The entropy of each position's next-token distribution, in nats: logits [..., V] ->
    [...] (float32; differentiable)."""
    return entropy_of(torch.log_softmax(logits.float(), dim=-1))


def entropy_of(logp: torch.Tensor) -> torch.Tensor:
    """``token_entropy`` from a log-softmax already taken ([..., V] -> [...]; differentiable)."""
    return -(logp.exp() * logp).sum(-1)


def entropy_detached(logp: torch.Tensor, chunk: int) -> torch.Tensor:
    """``entropy_of`` a log-softmax ([..., V] -> [...]), outside autograd,
    ``chunk`` positions at a time through one reused buffer: a fresh vocabulary-wide tensor per
    chunk cost 3x the time on CPU (allocating and faulting in the pages) and, whole, as much
    memory as the logits."""
    with torch.no_grad():
        flat = logp.detach().reshape(-1, logp.shape[-1])
        out = torch.empty(flat.shape[0], dtype=flat.dtype, device=flat.device)
        buf = torch.empty(min(chunk, flat.shape[0]), flat.shape[1], dtype=flat.dtype,
                          device=flat.device)
        for start in range(0, flat.shape[0], chunk):
            part = flat[start:start + chunk]
            b = buf[: part.shape[0]]
            torch.exp(part, out=b)
            b.mul_(part)
            torch.sum(b, dim=-1, out=out[start:start + part.shape[0]])
        return out.neg_().reshape(logp.shape[:-1])
