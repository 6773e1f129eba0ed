"""The matmuls of the serving forward pass, on the fastest kernel this host has for them.

On x86 CPUs torch's ``mm``/``addmm`` call MKL's sgemm, which on AMD processors takes its
AVX2 path: on the AMD EPYC host this engine is benchmarked on it runs at ~100 GFLOP/s per core
where oneDNN's AVX-512 inner product (``torch.ops.mkldnn._linear_pointwise``, the kernel
torch's own inductor emits for CPU linears) runs at ~210. oneDNN also fuses the residual add
into its output pass. It costs some microseconds more per call, which small matmuls feel:
it runs those whose weight is 1 MB or more (streamed from memory: there it wins at every
batch, 149 vs 111 tokens/s at batch 1 on the 25M-parameter bench model) or that do 2M
multiply-adds or more; the rest (the 0.8M-parameter built-in models below batch ~64: 1287 vs
798 tokens/s at batch 1) stay on ``mm``.

``Linears.for_weights`` picks the kernel once per model (CPU, float32 and a working oneDNN:
oneDNN; anything else, CUDA included: ``mm``). Weights are ``[out, in]`` and contiguous, as
``nn.Linear`` holds them. Both kernels accumulate in float32; results agree to float32
rounding, not bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from pivotflow.engines.torch.feedforward import MLP

_T = torch.Tensor
BIG_WEIGHT = 1 << 18  # elements (1 MB in float32): larger weights go to oneDNN at any batch
BIG_MATMUL = 1 << 21  # multiply-adds (rows x weight elements): so do matmuls this large


def _onednn_works(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether oneDNN's fused linear runs here (float32 on CPU; bf16/fp16 ``mm`` already goes
    through oneDNN or is faster than this op, measured)."""
    op = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
    if device.type != "cpu" or dtype != torch.float32 or op is None:
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    try:  # a torch build may list the op and still lack the kernel
        x, w = torch.ones(4, 8), torch.ones(2, 8)
        return bool(torch.equal(op(x, w, None, "none", [], ""), torch.full((4, 2), 8.0)))
    except RuntimeError:
        return False


class Linears:
    """``x @ w.T`` (+ bias) with the epilogues the decoder needs, on oneDNN or ``mm``."""

    def __init__(self, onednn: bool) -> None:
        self.onednn = onednn

    @classmethod
    def for_weights(cls, weight: _T) -> Linears:
        return cls(_onednn_works(weight.device, weight.dtype))

    def _dnn(self, x: _T, w: _T) -> bool:
        size = w.numel()
        return self.onednn and (size >= BIG_WEIGHT or x.shape[0] * size >= BIG_MATMUL)

    def linear(self, x: _T, w: _T, b: _T | None = None) -> _T:
        """``x @ w.T + b`` for ``x`` [rows, in]."""
        if self._dnn(x, w):
            return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
        return torch.mm(x, w.t()) if b is None else torch.addmm(b, x, w.t())

    def linear_add(self, x: _T, w: _T, b: _T | None, residual: _T) -> _T:
        """``residual + x @ w.T (+ b)``: the residual joins in the matmul's output pass."""
        if self._dnn(x, w):
            return torch.ops.mkldnn._linear_pointwise.binary(x, residual, w, b, "add")
        out = torch.addmm(residual, x, w.t())
        return out if b is None else out.add_(b)

    def gated(self, x: _T, w_gate_up: _T, inter: int,
              act: Callable[[_T], _T] = F.silu) -> _T:
        """``act(x @ gate.T) * (x @ up.T)``, the gated MLP's input half (SwiGLU; Gemma's
        GeGLU with ``act`` its tanh-GELU), for the packed ``[gate; up]`` rows ``w_gate_up``
        [2 * inter, in], as one matmul. (Two oneDNN matmuls with the SiLU and the multiply as
        their epilogues measured 4% slower in a decode step: one wide matmul streams the
        weights better than two half-width ones.)"""
        gate_up = self.linear(x, w_gate_up)
        return act(gate_up[:, :inter]).mul_(gate_up[:, inter:])


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


def pack_mlp(mlp: MLP) -> tuple[_T, _T]:
    """A SwiGLU MLP's weights for one gated matmul (``Linears.gated``): (packed [gate; up],
    down), the MLP's own parameters views of them."""
    if not mlp.gated:  # (Nemotron-H's: up and down alone)
        return mlp.up_proj.weight, mlp.down_proj.weight
    w_gate_up, _ = pack_linears([mlp.gate_proj, mlp.up_proj])
    return w_gate_up, mlp.down_proj.weight
