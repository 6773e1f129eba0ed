"""The serving matmuls give the same numbers on either kernel (oneDNN where the host has it,
``mm`` elsewhere), bias, residual and gate included, as float64 arithmetic does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pivotflow.engines.torch.linear import Linears

KERNELS = [pytest.param(False, id="mm"), pytest.param(True, id="onednn")]


def _kernel(onednn: bool) -> Linears:
    if onednn and not Linears.for_weights(torch.empty(0)).onednn:
        pytest.skip("oneDNN's fused linear does not run on this host")
    return Linears(onednn)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("onednn", KERNELS)
@pytest.mark.parametrize("rows", [1, 3, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_linears_match_float64(onednn: bool, rows: int, bias: bool) -> None:
    mm = _kernel(onednn)
    gen = torch.Generator().manual_seed(rows)
    # A weight of BIG_WEIGHT elements: oneDNN takes it at any batch.
    x, w = torch.randn(rows, 512, generator=gen), torch.randn(512, 512, generator=gen)
    assert mm._dnn(x, w) == onednn
    b = torch.randn(512, generator=gen) if bias else None
    residual = torch.randn(rows, 512, generator=gen)
    want = F.linear(x.double(), w.double(), None if b is None else b.double())
    close = {"atol": 1e-3, "rtol": 1e-4}
    torch.testing.assert_close(mm.linear(x, w, b).double(), want, **close)
    torch.testing.assert_close(mm.linear_add(x, w, b, residual).double(), want + residual, **close)
    inter = 256
    gate, up = want[:, :inter], want[:, inter:]
    if b is None:
        torch.testing.assert_close(mm.gated(x, w, inter).double(), F.silu(gate) * up, **close)


def test_small_matmuls_stay_on_mm() -> None:
    # The built-in 0.8M-parameter shapes (hidden 128): below batch ~64 oneDNN's call costs more
    # than it saves; the first matmul that is large enough by work alone goes to it.
    mm = Linears(True)
    w = torch.empty(256, 128)
    assert not mm._dnn(torch.empty(8, 128), w)
    assert mm._dnn(torch.empty(64, 128), w)


def test_kernel_choice_follows_device_and_dtype() -> None:
    assert not Linears.for_weights(torch.empty(0, dtype=torch.bfloat16)).onednn
    assert not Linears.for_weights(torch.empty(0, device="meta")).onednn
