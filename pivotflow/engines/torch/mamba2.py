"""Granite 4.0-H's Mamba2 layers: the state-space mixer on most of its layers.

Per head, a state ``S`` [head dim, state dim] stands in for every earlier token. Each token
decays it by ``exp(dt A)`` (``A = -exp(A_log)`` < 0 per head, ``dt = softplus(dt + dt_bias)``
its own time step) and writes ``dt x B^T`` (x the head's input, B the group's input
projection); the head reads ``y = S C + D x``. x, B and C come through a causal depthwise
convolution (biased) and SiLU; ``y`` is gated by SiLU of its own projection and RMS-normalised
per group of heads (``gated_group_norm``: gate first, then norm, Mamba2's order). Module and
parameter names are transformers' (``mamba.in_proj``, ``conv1d``, ``dt_bias``, ``A_log``,
``D``, ``norm``, ``out_proj``).

A whole sequence runs in chunks (``ssd_chunked``: within a chunk a masked, decayed product of
C and B, the state carried between chunks), one decoded token by ``ssd_step``; an engine keeps
each sequence's state and its convolution's last inputs (``linear_states.LinearStates``).
Everything past the projections runs in float32, as transformers' and vLLM's kernels do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pivotflow.engines.torch.model_config import ModelConfig

CHUNK = 64  # positions per chunk (the [chunk, chunk] products stay small on a CPU)


def gated_group_norm(y: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, groups: int,
                     eps: float, dtype: torch.dtype) -> torch.Tensor:
    """``y * silu(gate)`` RMS-normalised over each of ``groups`` equal parts of its last
    dimension, times ``weight``, in float32, then rounded to ``dtype``."""
    gated = y.float() * F.silu(gate.float())
    shape = gated.shape
    parts = gated.reshape(*shape[:-1], groups, shape[-1] // groups)
    normed = torch.rms_norm(parts, (parts.shape[-1],), None, eps).reshape(shape)
    return (normed * weight.float()).to(dtype)


def ssd_chunked(
    x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
    state: torch.Tensor | None = None, chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scan over whole sequences, float32: x [B, H, T, P], dt [B, H, T] (after softplus
    and clamp), a [H] (A, negative), b, c [B, H, T, N] (each head its group's); ``state``
    [B, H, P, N] to start from (None: zeros). Returns (y [B, H, T, P] without D's skip, the
    state after position T-1). A position with dt 0 leaves the state as it was (padding).

    Within a chunk, with cum_t the log decay up to t, ``y_t = sum_s<=t exp(cum_t - cum_s)
    (c_t.b_s) dt_s x_s + exp(cum_t) S0 c_t`` and the state at its end ``exp(cum_C) S0 +
    sum_s exp(cum_C - cum_s) dt_s x_s b_s^T``."""
    batch, heads, t, p = x.shape
    n_state = b.shape[-1]
    pad = -t % chunk
    if pad:
        x, b, c = (F.pad(v, (0, 0, 0, pad)) for v in (x, b, c))
        dt = F.pad(dt, (0, pad))
    n = (t + pad) // chunk
    x, b, c = (v.reshape(batch, heads, n, chunk, v.shape[-1]) for v in (x, b, c))
    dt = dt.reshape(batch, heads, n, chunk)
    cum = (dt * a[:, None, None]).cumsum(-1)  # log of the decay from the chunk's start
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).triu(1)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(later, float("-inf")).exp()
    xdt = x * dt[..., None]
    out = ((c @ b.transpose(-1, -2)) * decay) @ xdt  # within each chunk
    # each chunk's writes decayed to its end, [B, H, n, P, N]
    writes = (xdt * (cum[..., -1:] - cum).exp()[..., None]).transpose(-1, -2) @ b
    to_end = cum[..., -1].exp()[..., None, None]
    from_start = cum.exp()[..., None]
    s = (torch.zeros(batch, heads, p, n_state, dtype=x.dtype, device=x.device) if state is None
         else state.to(x.dtype))
    for i in range(n):
        out[:, :, i] += from_start[:, :, i] * (c[:, :, i] @ s.transpose(-1, -2))
        s = s * to_end[:, :, i] + writes[:, :, i]
    return out.reshape(batch, heads, n * chunk, p)[:, :, :t], s


def ssd_step(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
             c: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """One token per sequence, float32: x [n, H, P], dt [n, H], a [H], b, c [n, H, N];
    ``state`` [n, H, P, N] (contiguous) updated in place. Returns y [n, H, P] without D's
    skip: the state decayed, written, then read (one pass over it each)."""
    n, h, p, d = state.shape
    s = state.view(n * h, p, d)
    s.mul_((dt * a).exp().reshape(n * h, 1, 1))
    s.baddbmm_((x * dt[..., None]).reshape(n * h, p, 1), b.reshape(n * h, 1, d))
    return torch.bmm(s, c.reshape(n * h, d, 1)).view(n, h, p)


class GroupNorm(nn.Module):
    """Mamba2's gated RMSNorm (``mamba.norm``): its weight over the inner width."""

    def __init__(self, width: int, groups: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.groups, self.eps = groups, eps


class Mamba2(nn.Module):
    """A Granite 4.0-H Mamba2 layer (``mamba``) for training and scoring: whole right-padded
    sequences, no state kept (the engine's: ``mamba2_serving``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.mamba_n_heads, cfg.mamba_d_head
        self.groups, self.state_dim = cfg.mamba_n_groups, cfg.mamba_d_state
        self.inner = cfg.mamba_d_inner
        self.conv_dim = self.inner + 2 * self.groups * self.state_dim
        self.time_step_limit = cfg.time_step_limit
        size = cfg.hidden_size
        self.in_proj = nn.Linear(size, self.inner + self.conv_dim + self.heads,
                                 bias=cfg.mamba_proj_bias)
        taps = cfg.mamba_d_conv
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, taps, bias=cfg.mamba_conv_bias,
                                groups=self.conv_dim, padding=taps - 1)
        # transformers' initialisation; a loaded model overwrites it
        self.dt_bias = nn.Parameter(torch.ones(self.heads))
        self.A_log = nn.Parameter(torch.arange(1, self.heads + 1, dtype=torch.float32).log())
        self.D = nn.Parameter(torch.ones(self.heads))
        self.norm = GroupNorm(self.inner, self.groups, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.inner, size, bias=cfg.mamba_proj_bias)

    @property
    def split(self) -> list[int]:
        """in_proj's rows: the gate, x|B|C (the convolution's channels), the time steps."""
        return [self.inner, self.conv_dim, self.heads]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, hidden] -> [B, T, hidden]. Right padding needs no mask: a padded position
        comes after every real one of its row, and nothing flows backwards."""
        batch, t, _ = x.shape
        gate, xbc, dt = self.in_proj(x).split(self.split, -1)
        w = self.conv1d.weight
        xbc = F.silu(F.conv1d(xbc.transpose(1, 2), w, self.conv1d.bias, padding=w.shape[-1] - 1,
                              groups=self.conv_dim)[..., :t]).transpose(1, 2)
        xs, b, c = self.heads_of(xbc)
        y, _ = ssd_chunked(xs.transpose(1, 2), self.time_steps(dt).transpose(1, 2), self.a,
                           b.transpose(1, 2), c.transpose(1, 2))
        y = y.transpose(1, 2) + xs * self.D.float()[:, None]
        out = gated_group_norm(y.reshape(batch, t, -1), gate, self.norm.weight, self.groups,
                               self.norm.eps, x.dtype)
        return self.out_proj(out)

    @property
    def a(self) -> torch.Tensor:
        """Each head's A (negative), float32."""
        return -self.A_log.float().exp()

    def heads_of(self, xbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The convolved x|B|C [..., conv_dim] as float32 heads: x [..., H, P], and B and C
        [..., H, N], each head its group's."""
        width = self.groups * self.state_dim
        xs, b, c = xbc.float().split([self.inner, width, width], -1)
        shape, per = xbc.shape[:-1], self.heads // self.groups
        b, c = (v.reshape(*shape, self.groups, 1, self.state_dim)
                .expand(*shape, self.groups, per, self.state_dim)
                .reshape(*shape, self.heads, self.state_dim) for v in (b, c))
        return xs.reshape(*shape, self.heads, self.head_dim), b, c

    def time_steps(self, dt: torch.Tensor) -> torch.Tensor:
        """Each head's time step [..., H] (float32): softplus(dt + dt_bias), clamped to
        time_step_limit."""
        low, high = self.time_step_limit
        return F.softplus(dt.float() + self.dt_bias.float()).clamp(low, high)
