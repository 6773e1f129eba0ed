"""policy_loss with one advantage per token ([B, T], GAE's) against the per-sequence form and
hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from pivotflow.errors import RLError
from pivotflow.rl import policy_loss

AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]

# clip_eps 0.2. Row 0: rho 1.0 (inside), 1.5 (clipped high for A > 0), 0.5 (clipped low for
# A < 0); row 1: rho 1.0, 1.0, and a masked position.
RATIOS = [[1.0, 1.5, 0.5], [1.0, 1.0, 2.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
TOKEN_ADV = [[2.0, 1.0, -1.0], [3.0, -1.0, 0.0]]


def _logprobs(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    old = torch.tensor([[-0.5, -1.0, -2.0], [-0.3, -0.7, -1.1]])
    new = (old + torch.log(torch.tensor(ratios))).requires_grad_(True)
    return new, old


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_a_rows_advantage_on_every_token_is_the_sequence_level_loss(aggregation: str,
                                                                     level: str) -> None:
    # row 0 has a clipped-high token (A > 0, rho 1.5) and row 1 a clipped-low one (A < 0, rho 0.5)
    ratios = [[1.0, 1.5, 0.9], [0.5, 1.1, 2.0]]
    seq_adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor(MASK)
    new_s, old = _logprobs(ratios)
    new_t, _ = _logprobs(ratios)
    kwargs = {"aggregation": aggregation, "importance_sampling_level": level,
              "clip_eps": 0.2 if level == "token" else 0.05}
    loss_s, stats_s = policy_loss(new_s, old, seq_adv, mask, **kwargs)  # type: ignore[arg-type]
    loss_t, stats_t = policy_loss(new_t, old, seq_adv[:, None].expand(2, 3), mask,
                                  **kwargs)  # type: ignore[arg-type]
    loss_s.backward()
    loss_t.backward()
    assert stats_s["clip_frac"] > 0  # the clip is active, so the comparison covers it
    torch.testing.assert_close(loss_t, loss_s)
    torch.testing.assert_close(new_t.grad, new_s.grad)
    assert stats_t == pytest.approx(stats_s)


@pytest.mark.parametrize(("aggregation", "expected"), [
    # per token: row 0 -2 (rho 1, A 2), -1.2 (1.5 clipped to 1.2, A 1), 0.8 (0.5 clipped to 0.8,
    # A -1); row 1 -3 (rho 1, A 3), +1 (rho 1, A -1)
    ("token-mean", (-2.0 - 1.2 + 0.8 - 3.0 + 1.0) / 5),     # -0.88
    ("seq-mean-token-mean", (-2.4 / 3 + -2.0 / 2) / 2),    # -0.9
    ("seq-mean-token-sum", (-2.4 + -2.0) / 2),             # -2.2
])
def test_hand_computed_per_token_advantages(aggregation: str, expected: float) -> None:
    new, old = _logprobs(RATIOS)
    loss, stats = policy_loss(new, old, torch.tensor(TOKEN_ADV), torch.tensor(MASK),
                              aggregation=aggregation)  # type: ignore[arg-type]
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert stats["clip_frac"] == pytest.approx(2 / 5)
    assert stats["clip_frac_low"] == pytest.approx(1 / 5)
    assert stats["clip_frac_high"] == pytest.approx(1 / 5)


def test_hand_computed_per_token_gradient() -> None:
    # token-mean over 5 tokens: d(-rho * A / 5)/d(logprob) = -rho * A / 5 where unclipped (rho 1
    # there), 0 where the clip is active or the position masked
    new, old = _logprobs(RATIOS)
    loss, _ = policy_loss(new, old, torch.tensor(TOKEN_ADV), torch.tensor(MASK))
    loss.backward()
    torch.testing.assert_close(new.grad, torch.tensor([[-2 / 5, 0.0, 0.0],
                                                       [-3 / 5, 1 / 5, 0.0]]))


def test_tokens_of_one_row_get_different_gradients_from_their_own_advantages() -> None:
    # the same row with sequence advantage 1 vs token advantages (2, 1, -1): token 0 doubles its
    # gradient, token 2 (0.5 ratio, so no clip at A > 0) flips sign and is then clipped
    new, old = _logprobs(RATIOS)
    mask = torch.tensor(MASK)
    seq_loss, _ = policy_loss(new, old, torch.tensor([1.0, 1.0]), mask)
    (seq_grad,) = torch.autograd.grad(seq_loss, new)
    tok_loss, _ = policy_loss(new, old, torch.tensor(TOKEN_ADV), mask)
    (tok_grad,) = torch.autograd.grad(tok_loss, new)
    torch.testing.assert_close(seq_grad[0], torch.tensor([-1 / 5, 0.0, -0.5 / 5]))
    torch.testing.assert_close(tok_grad[0], torch.tensor([-2 / 5, 0.0, 0.0]))


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_inf_or_nan_at_masked_advantages_does_not_leak(aggregation: str, level: str,
                                                       bad: float) -> None:
    new, old = _logprobs(RATIOS)
    mask = torch.tensor(MASK)
    clean = torch.tensor(TOKEN_ADV)
    dirty = clean.clone()
    dirty[1, 2] = bad
    kwargs = {"aggregation": aggregation, "importance_sampling_level": level}
    want, want_stats = policy_loss(new, old, clean, mask, **kwargs)  # type: ignore[arg-type]
    (want_grad,) = torch.autograd.grad(want, new)
    got, got_stats = policy_loss(new, old, dirty, mask, **kwargs)  # type: ignore[arg-type]
    (got_grad,) = torch.autograd.grad(got, new)
    assert math.isfinite(got.item())
    assert torch.isfinite(got_grad).all()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)
    assert got_stats == pytest.approx(want_stats)


def test_advantages_of_another_shape_name_both_allowed_shapes() -> None:
    new, old = _logprobs(RATIOS)
    mask = torch.tensor(MASK)
    for adv in (torch.zeros(2, 4), torch.zeros(3), torch.zeros(3, 2), torch.zeros(2, 3, 1)):
        with pytest.raises(RLError, match=r"advantages must be \[B\] = \[2\] or "
                                          r"\[B, T\] = \[2, 3\], got"):
            policy_loss(new, old, adv, mask)
