"""Qwen3.5's gated DeltaNet: the linear attention on three of its four layers.

Per value head, a state ``S`` [key dim, value dim] stands in for the keys and values of every
earlier token. Each token first decays it, ``S <- exp(g) * S`` (``g`` <= 0), then writes the
part of its value the state does not yet predict from its key, ``S <- S + k (beta (v - S^T k))^T``
(the delta rule; ``beta`` in (0, 1) is how much), and reads ``o = S^T q``. q and k are
L2-normalised and q scaled by ``key dim ** -0.5``. Before that, q, k and v go through a causal
depthwise convolution of a few taps and SiLU; after it, ``o`` is RMS-normalised and gated by
SiLU of its own projection (``GatedRMSNorm``). Module and parameter names are transformers'
(``linear_attn.in_proj_qkv``, ``conv1d``, ``A_log``, ``dt_bias``, ``norm``, ``out_proj``).

A whole sequence runs in chunks (``gated_delta_chunked``: within a chunk the delta rule's
recurrence is one triangular solve, between chunks the state carries over), one decoded token
by ``gated_delta_step``; an engine keeps each sequence's state and its convolution's last
inputs (``linear_states.LinearStates``) instead of keys and values. Everything past the
projections runs in float32, as transformers' and vLLM's kernels do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pivotflow.engines.torch.model_config import ModelConfig

CHUNK = 64  # positions per chunk (transformers' and the fla kernels' default)
L2_EPS = 1e-6  # q and k's L2 norm (fla's, which transformers and vLLM follow)


class GatedRMSNorm(nn.Module):
    """RMSNorm over each value head, its output times SiLU of ``gate`` (weights start at 1,
    not offset): normalised in float32, rounded and scaled, then gated in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(x, gate, self.weight, self.eps)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor,
                   eps: float) -> torch.Tensor:
    dtype = x.dtype
    normed = weight * torch.rms_norm(x.float(), (x.shape[-1],), None, eps).to(dtype)
    return (normed * F.silu(gate.float())).to(dtype)


def l2_normed(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def gated_delta_chunked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor | None = None, chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over whole sequences: q, k [B, H, T, Dk] (already normalised and
    q scaled), v [B, H, T, Dv], g, beta [B, H, T], all float32; ``state`` [B, H, Dk, Dv] to
    start from (None: zeros). Returns (outputs [B, H, T, Dv], the state after position T-1).
    A position with ``beta`` 0 and ``g`` 0 leaves the state as it was (padding).

    Within a chunk, with G_t the chunk's decay up to t (cumulative), the values written are
    ``d = (I + A)^-1 (beta v - beta G K S0)``, A_ts = beta_t (G_t / G_s) k_t.k_s for s < t
    (one unit-lower-triangular solve), the outputs ``G_t q_t S0 + sum_s<=t (G_t / G_s)
    q_t.k_s d_s`` and the state ``G_C S0 + sum_s (G_C / G_s) k_s d_s^T``."""
    b, h, t, dk = k.shape
    dv = v.shape[-1]
    pad = -t % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (t + pad) // chunk
    q, k, v = (x.reshape(b, h, n, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(b, h, n, chunk), beta.reshape(b, h, n, chunk)
    cum = g.cumsum(-1)  # log G_t
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    # (G_t / G_s) for s <= t, 0 above the diagonal (exp(-inf)): the decay from s to t
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(later, float("-inf")).exp()
    k_beta = k * beta[..., None]
    k_t = k.transpose(-1, -2).contiguous()  # (once: each matmul would copy it again)
    system = (k_beta @ k_t) * decay  # (its diagonal is read as ones)
    rhs = torch.cat((v * beta[..., None], k_beta * cum.exp()[..., None]), -1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    written, k_decayed = solved[..., :dv], solved[..., dv:]
    scores = (q @ k_t) * decay
    q_decayed = q * cum.exp()[..., None]
    k_to_end_t = k_t * (cum[..., -1:] - cum).exp()[..., None, :]  # (transposed: read by rows)
    chunk_decay = cum[..., -1].exp()[..., None, None]
    s = (torch.zeros(b, h, dk, dv, dtype=q.dtype, device=q.device) if state is None
         else state.to(q.dtype))
    out = torch.empty_like(written)
    for i in range(n):
        d = written[:, :, i] - k_decayed[:, :, i] @ s
        out[:, :, i] = q_decayed[:, :, i] @ s + scores[:, :, i] @ d
        s = s * chunk_decay[:, :, i] + k_to_end_t[:, :, i] @ d
    return out.reshape(b, h, n * chunk, dv)[:, :, :t], s


def gated_delta_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """One token per sequence: q, k [N, H, Dk], v [N, H, Dv], g, beta [N, H] (float32);
    ``state`` [N, H, Dk, Dv] (contiguous) updated in place. Returns the outputs [N, H, Dv].

    The state is the largest thing a decode step touches, so it is read once for both of its
    products with the old state (S^T k and S^T q, one batched matmul) and written once: with
    the decayed state gS, the prediction is g S^T k, the write d = beta (v - g S^T k), the new
    state gS + k d^T, and the output (gS + k d^T)^T q = g S^T q + (k.q) d."""
    n, h, dk, dv = state.shape
    s = state.view(n * h, dk, dv)
    decay = g.exp().reshape(n * h, 1)
    read = torch.bmm(torch.stack((k, q), -2).reshape(n * h, 2, dk), s)  # [N*H, 2, Dv]
    written = (v.reshape(n * h, dv) - read[:, 0] * decay) * beta.reshape(n * h, 1)
    out = read[:, 1] * decay + (k * q).sum(-1).reshape(n * h, 1) * written
    s.mul_(decay[:, :, None]).baddbmm_(k.reshape(n * h, dk, 1), written[:, None])
    return out.view(n, h, dv)


class GatedDeltaNet(nn.Module):
    """A Qwen3.5 (and Qwen3-Next, held split) linear-attention layer (``linear_attn``) for
    training and scoring: whole right-padded sequences, no state kept (the engine's:
    ``deltanet_serving``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.k_heads, self.v_heads = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        key_dim, value_dim = self.k_heads * self.dk, self.v_heads * self.dv
        self.conv_dim = 2 * key_dim + value_dim
        size = cfg.hidden_size
        self.in_proj_qkv = nn.Linear(size, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(size, value_dim, bias=False)
        self.in_proj_b = nn.Linear(size, self.v_heads, bias=False)
        self.in_proj_a = nn.Linear(size, self.v_heads, bias=False)
        taps = cfg.linear_conv_kernel_dim
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, taps, bias=False,
                                groups=self.conv_dim, padding=taps - 1)
        self.dt_bias = nn.Parameter(torch.ones(self.v_heads))
        # transformers' initialisation (log of uniform(0.01, 16)); a loaded model overwrites it
        self.A_log = nn.Parameter(torch.empty(self.v_heads).uniform_(0.01, 16).log())
        self.norm = GatedRMSNorm(self.dv, cfg.linear_norm_eps)
        self.beta_scale = 2.0 if cfg.linear_allow_neg_eigval else 1.0  # (OLMo Hybrid's)
        self.out_proj = nn.Linear(value_dim, size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, hidden] -> [B, T, hidden]. Right padding needs no mask: a padded position
        comes after every real one of its row, and nothing flows backwards."""
        b, t, _ = x.shape
        mixed = self.in_proj_qkv(x).transpose(1, 2)
        w = self.conv1d.weight
        mixed = F.silu(F.conv1d(mixed, w, padding=w.shape[-1] - 1,
                                groups=self.conv_dim)[..., :t]).transpose(1, 2)
        q, k, v = self.heads_of(mixed)
        g, beta = self.decay_and_rate(self.in_proj_a(x), self.in_proj_b(x))
        out, _ = gated_delta_chunked(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                     g.transpose(1, 2), beta.transpose(1, 2))
        z = self.in_proj_z(x).view(b, t, self.v_heads, self.dv)
        out = self.norm(out.transpose(1, 2).to(x.dtype), z)
        return self.out_proj(out.reshape(b, t, -1))

    def heads_of(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The convolved q|k|v [..., conv_dim] as float32 heads [..., v_heads, D]: q and k
        L2-normalised, q scaled, each key head repeated for its value heads."""
        key_dim = self.k_heads * self.dk
        q, k, v = mixed.float().split([key_dim, key_dim, self.v_heads * self.dv], -1)
        shape = mixed.shape[:-1]
        q, k = (l2_normed(x.reshape(*shape, self.k_heads, self.dk)) for x in (q, k))
        rep = self.v_heads // self.k_heads
        if rep > 1:
            q, k = q.repeat_interleave(rep, -2), k.repeat_interleave(rep, -2)
        return q * self.dk**-0.5, k, v.reshape(*shape, self.v_heads, self.dv)

    def decay_and_rate(self, a: torch.Tensor,
                       b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each value head's log decay ``g`` and write rate ``beta`` [..., v_heads] (float32)
        from the projections ``a`` and ``b``: g = -exp(A_log) * softplus(a + dt_bias),
        beta = sigmoid(b) (OLMo Hybrid's: twice that)."""
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        beta = b.sigmoid().float()
        return g, beta * self.beta_scale if self.beta_scale != 1.0 else beta
