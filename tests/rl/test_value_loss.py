"""PPO's clipped value loss against hand-worked numbers and a plain-Python loop reference."""

from __future__ import annotations

import math
import random

import pytest
import torch

from pivotflow.errors import RLError
from pivotflow.rl import value_loss

AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
NAN, INF = float("nan"), float("inf")

# clip 0.2, per token (V_clip = old + clamp(v - old, -0.2, 0.2)):
# row 0  old 0, v 0.1, ret 1: inside the clip, both branches 0.81      -> 0.405
#        old 0, v 0.5, ret 1: V_clip 0.2, 0.25 vs 0.64, clipped chosen -> 0.32
#        old 0, v 0.5, ret 0: V_clip 0.2, 0.25 vs 0.04, unclipped      -> 0.125
# row 1  old 1, v 0.5, ret 2: V_clip 0.8, 2.25 vs 1.44, unclipped      -> 1.125
#        old 1, v 0.0, ret 0: V_clip 0.8, 0.0 vs 0.64, clipped chosen  -> 0.32
#        masked (NaN value, inf old, -inf return)
VALUES = [[0.1, 0.5, 0.5], [0.5, 0.0, NAN]]
OLD = [[0.0, 0.0, 0.0], [1.0, 1.0, INF]]
RETURNS = [[1.0, 1.0, 0.0], [2.0, 0.0, -INF]]
MASK = [[1, 1, 1], [1, 1, 0]]


def _example() -> tuple[torch.Tensor, ...]:
    return (torch.tensor(VALUES, requires_grad=True), torch.tensor(OLD, requires_grad=True),
            torch.tensor(RETURNS, requires_grad=True), torch.tensor(MASK))


@pytest.mark.parametrize(("aggregation", "expected"), [
    ("token-mean", (0.405 + 0.32 + 0.125 + 1.125 + 0.32) / 5),           # 0.459
    ("seq-mean-token-mean", ((0.405 + 0.32 + 0.125) / 3 + (1.125 + 0.32) / 2) / 2),
    ("seq-mean-token-sum", ((0.405 + 0.32 + 0.125) + (1.125 + 0.32)) / 2),  # 1.1475
])
def test_hand_worked_clipped_loss(aggregation: str, expected: float) -> None:
    values, old, returns, mask = _example()
    loss, stats = value_loss(values, old, returns, mask, clip=0.2,
                             aggregation=aggregation)  # type: ignore[arg-type]
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert stats == pytest.approx({
        "value_loss": expected,
        "value_clip_frac": 2 / 5,           # row 0 token 1, row 1 token 1
        "value_mean": (0.1 + 0.5 + 0.5 + 0.5 + 0.0) / 5,
        "return_mean": (1.0 + 1.0 + 0.0 + 2.0 + 0.0) / 5,
        "value_error": (0.9 + 0.5 + 0.5 + 1.5 + 0.0) / 5,
    }, rel=1e-6)


def test_hand_worked_unclipped_loss() -> None:
    values, old, returns, mask = _example()
    loss, stats = value_loss(values, old, returns, mask, clip=None)
    # 0.5 * (0.81 + 0.25 + 0.25 + 2.25 + 0) / 5
    assert loss.item() == pytest.approx(0.356, rel=1e-6)
    assert stats["value_loss"] == pytest.approx(0.356, rel=1e-6)
    assert stats["value_clip_frac"] == 0.0


def test_gradient_goes_only_into_values_and_is_the_analytic_one() -> None:
    # d/dv of 0.5 * (v - ret)^2 / 5 is (v - ret) / 5 where the unclipped branch is taken (or
    # the two tie inside the clip), 0 where the clipped one is (its V_clip is a constant there)
    values, old, returns, mask = _example()
    loss, _ = value_loss(values, old, returns, mask, clip=0.2)
    loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[-0.9 / 5, 0.0, 0.5 / 5],
                                                          [-1.5 / 5, 0.0, 0.0]]))
    assert old.grad is None and returns.grad is None

    values, old, returns, mask = _example()
    loss, _ = value_loss(values, old, returns, mask, clip=None)
    loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[-0.9 / 5, -0.5 / 5, 0.5 / 5],
                                                          [-1.5 / 5, 0.0, 0.0]]))


def _ref(values: list[list[float]], old: list[list[float]], returns: list[list[float]],
         mask: list[list[int]], clip: float | None,
         aggregation: str) -> tuple[float, float, list[list[float]]]:
    """Straight loops over Python floats: (loss, clip_frac, d loss / d values)."""
    per_seq: list[float] = []
    tokens: list[float] = []
    n_clipped = 0
    rows_used = sum(1 for row in mask if any(row))
    n_tokens = sum(sum(row) for row in mask)
    grads = [[0.0] * len(row) for row in values]
    for i, row in enumerate(values):
        losses = []
        for t, v in enumerate(row):
            if not mask[i][t]:
                continue
            err = (v - returns[i][t]) ** 2
            take_clipped = False
            if clip is not None:
                v_clip = old[i][t] + min(max(v - old[i][t], -clip), clip)
                take_clipped = (v_clip - returns[i][t]) ** 2 > err
                err = max(err, (v_clip - returns[i][t]) ** 2)
            n_clipped += take_clipped
            losses.append(0.5 * err)
            if aggregation == "token-mean":
                weight = 1 / n_tokens
            elif aggregation == "seq-mean-token-mean":
                weight = 1 / (sum(mask[i]) * rows_used)
            else:
                weight = 1 / rows_used
            grads[i][t] = 0.0 if take_clipped else (v - returns[i][t]) * weight
        tokens += losses
        if losses:
            per_seq.append(sum(losses) / len(losses) if aggregation.endswith("mean")
                           else sum(losses))
    pool = tokens if aggregation == "token-mean" else per_seq
    return sum(pool) / max(len(pool), 1), n_clipped / max(n_tokens, 1), grads


@pytest.mark.parametrize("clip", [None, 0.1, 0.5])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_loop_reference_on_random_inputs(seed: int, aggregation: str,
                                                 clip: float | None) -> None:
    rng = random.Random(seed)
    b, t = 4, 6
    old = [[rng.gauss(0, 1) for _ in range(t)] for _ in range(b)]
    values = [[o + rng.gauss(0, 0.5) for o in row] for row in old]
    returns = [[rng.gauss(0, 1) for _ in range(t)] for _ in range(b)]
    mask = [[int(rng.random() < 0.7) for _ in range(t)] for _ in range(b)]
    mask[1] = [0] * t  # a padding row
    want, want_frac, want_grad = _ref(values, old, returns, mask, clip, aggregation)
    v = torch.tensor(values, dtype=torch.float64, requires_grad=True)
    loss, stats = value_loss(v, torch.tensor(old, dtype=torch.float64),
                             torch.tensor(returns, dtype=torch.float64), torch.tensor(mask),
                             clip=clip, aggregation=aggregation)  # type: ignore[arg-type]
    loss.backward()
    assert loss.item() == pytest.approx(want, rel=1e-9)
    assert stats["value_clip_frac"] == pytest.approx(want_frac)
    torch.testing.assert_close(v.grad, torch.tensor(want_grad, dtype=torch.float64))


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("clip", [None, 0.2])
def test_inf_or_nan_at_masked_positions_does_not_leak(aggregation: str,
                                                      clip: float | None) -> None:
    values, old, returns, mask = _example()
    loss, stats = value_loss(values, old, returns, mask, clip=clip,
                             aggregation=aggregation)  # type: ignore[arg-type]
    loss.backward()
    assert math.isfinite(loss.item())
    assert values.grad is not None and torch.isfinite(values.grad).all()
    assert values.grad[1, 2].item() == 0.0
    assert all(math.isfinite(x) for x in stats.values()), stats


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_an_all_zero_mask_gives_zero_not_nan(aggregation: str) -> None:
    values, old, returns, _ = _example()
    loss, stats = value_loss(values, old, returns, torch.zeros(2, 3),
                             aggregation=aggregation)  # type: ignore[arg-type]
    loss.backward()
    assert loss.item() == 0.0 and loss.requires_grad
    assert all(x == 0.0 for x in stats.values()), stats


def test_bf16_values_are_scored_in_float32() -> None:
    values, old, returns, mask = _example()
    want, _ = value_loss(values.detach().to(torch.bfloat16).float(), old, returns, mask)
    got, _ = value_loss(values.detach().to(torch.bfloat16), old, returns, mask)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want)


def test_bad_inputs_are_one_line_rl_errors() -> None:
    values, old, returns, mask = _example()
    cases = [
        ((values[0], old[0], returns[0], mask[0]), {}, "values must be [B, T], got (3,)"),
        ((values, old[:, :2], returns, mask), {},
         "old_values has shape (2, 2), expected values' shape (2, 3)"),
        ((values, old, returns[:1], mask), {}, "returns has shape (1, 3)"),
        ((values, old, returns, mask.T), {}, "mask has shape (3, 2)"),
        ((values, old, returns, mask), {"clip": 0.0}, "clip must be None or > 0, got 0.0"),
        ((values, old, returns, mask), {"clip": -0.2}, "clip must be None or > 0, got -0.2"),
        ((values, old, returns, mask), {"clip": NAN}, "clip must be None or > 0, got nan"),
        ((values, old, returns, mask), {"aggregation": "sum"}, "aggregation must be one of"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(RLError) as err:
            value_loss(*args, **kwargs)  # type: ignore[arg-type]
        assert str(err.value).startswith("value_loss: ")
        assert message in str(err.value) and "\n" not in str(err.value)
