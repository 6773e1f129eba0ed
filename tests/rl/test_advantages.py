"""GRPO / Dr. GRPO / RLOO advantages against hand-computed values and plain-Python references."""

from __future__ import annotations

import math
import random

import pytest
import torch

from pivotflow.errors import RLError
from pivotflow.rl import grpo_advantages, rloo_advantages
from pivotflow.rl.advantages import grpo_list, rloo_list


def _ref_grpo(group: list[float], normalize_std: bool, eps: float) -> list[float]:
    g = len(group)
    mean = sum(group) / g
    std = math.sqrt(sum((r - mean) ** 2 for r in group) / (g - 1))
    if not normalize_std:
        return [r - mean for r in group]
    return [(r - mean) / (std + eps) if std > 0 else 0.0 for r in group]


def _ref_rloo(group: list[float]) -> list[float]:
    g = len(group)
    return [r - sum(group[j] for j in range(g) if j != i) / (g - 1) for i, r in enumerate(group)]


def test_grpo_hand_computed_uses_unbiased_std() -> None:
    # mean 0.5; sample std sqrt((4 * 0.25) / 3) = 0.57735; population std would give +-1.
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), eps=0.0)
    expected = torch.tensor([0.8660254, -0.8660254, -0.8660254, 0.8660254])
    torch.testing.assert_close(adv, expected)


def test_dr_grpo_only_centers() -> None:
    adv = grpo_advantages(torch.tensor([3.0, 1.0, 2.0, 6.0]), normalize_std=False)
    torch.testing.assert_close(adv, torch.tensor([0.0, -2.0, -1.0, 3.0]))


def test_grpo_integer_rewards_become_float() -> None:
    adv = grpo_advantages(torch.tensor([1, 0]), eps=0.0)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor([0.70710678, -0.70710678]))


@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_grpo_equal_rewards_give_zeros_not_nan(eps: float) -> None:
    adv = grpo_advantages(torch.tensor([[0.5, 0.5, 0.5], [1.0, 0.0, 1.0]]), eps=eps)
    assert torch.isfinite(adv).all()
    assert torch.equal(adv[0], torch.zeros(3))
    assert adv[1].abs().sum() > 0


@pytest.mark.parametrize("normalize_std", [True, False])
def test_grpo_matches_reference_on_random_groups(normalize_std: bool) -> None:
    rng = random.Random(0)
    groups = [[rng.uniform(-3, 3) for _ in range(5)] for _ in range(7)]
    adv = grpo_advantages(torch.tensor(groups, dtype=torch.float64), normalize_std=normalize_std)
    assert adv.shape == (7, 5)
    for row, group in zip(adv.tolist(), groups, strict=True):
        assert row == pytest.approx(_ref_grpo(group, normalize_std, 1e-6), rel=1e-9, abs=1e-12)


def test_grpo_one_group_equals_row_of_many() -> None:
    rewards = torch.tensor([[0.0, 1.0, 1.0, 0.0], [2.0, 0.0, 1.0, 5.0]])
    many = grpo_advantages(rewards)
    for i in range(2):
        torch.testing.assert_close(grpo_advantages(rewards[i]), many[i])


def test_rloo_hand_computed() -> None:
    # r - mean of the others: 1 - 11/3, 2 - 10/3, 3 - 9/3, 6 - 6/3
    adv = rloo_advantages(torch.tensor([1.0, 2.0, 3.0, 6.0]))
    torch.testing.assert_close(adv, torch.tensor([-8 / 3, -4 / 3, 0.0, 4.0]))


def test_rloo_matches_reference_on_random_groups() -> None:
    rng = random.Random(1)
    groups = [[rng.uniform(-1, 1) for _ in range(4)] for _ in range(6)]
    adv = rloo_advantages(torch.tensor(groups, dtype=torch.float64))
    assert adv.shape == (6, 4)
    for row, group in zip(adv.tolist(), groups, strict=True):
        assert row == pytest.approx(_ref_rloo(group), rel=1e-9, abs=1e-12)
    one = rloo_advantages(torch.tensor(groups[0], dtype=torch.float64))
    assert one.shape == (4,)
    assert one.tolist() == pytest.approx(_ref_rloo(groups[0]), rel=1e-9, abs=1e-12)


def test_rloo_equals_scaled_centered_rewards() -> None:
    rewards = torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0]])
    centered = grpo_advantages(rewards, normalize_std=False)
    torch.testing.assert_close(rloo_advantages(rewards), centered * 5 / 4)


@pytest.mark.parametrize("fn", [grpo_advantages, rloo_advantages])
def test_group_of_one_is_rejected(fn) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RLError, match="group size must be >= 2"):
        fn(torch.tensor([1.0]))
    with pytest.raises(RLError, match="group size must be >= 2"):
        fn(torch.tensor([[1.0], [0.0]]))


@pytest.mark.parametrize("fn", [grpo_advantages, rloo_advantages])
def test_bad_shapes_and_values_are_rejected(fn) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RLError, match=r"shape \[G\] or \[N, G\]"):
        fn(torch.zeros(2, 2, 2))
    with pytest.raises(RLError, match=r"index \(1, 2\) is not finite"):
        fn(torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, float("nan")]]))


def test_advantages_carry_no_gradient() -> None:
    rewards = torch.tensor([1.0, 0.0, 2.0], requires_grad=True)
    assert not grpo_advantages(rewards).requires_grad
    assert not rloo_advantages(rewards).requires_grad


@pytest.mark.parametrize("seed", range(5))
def test_list_forms_match_the_tensor_forms(seed: int) -> None:
    # group functions use the list forms on the controller's hot path: same numbers
    gen = torch.Generator().manual_seed(seed)
    for rewards in (torch.rand(8, generator=gen), (torch.rand(6, generator=gen) > 0.5).double(),
                    torch.ones(4, dtype=torch.float64)):
        r = rewards.double()
        as_list = r.tolist()
        for std in (True, False):
            expect = grpo_advantages(r, normalize_std=std)
            assert grpo_list(as_list, normalize_std=std) == pytest.approx(expect.tolist(),
                                                                          abs=1e-12)
        assert rloo_list(as_list) == pytest.approx(rloo_advantages(r).tolist(), abs=1e-12)


def test_list_forms_reject_what_the_tensor_forms_reject() -> None:
    with pytest.raises(RLError, match="group size must be >= 2"):
        grpo_list([1.0])
    with pytest.raises(RLError, match=r"index 1 is not finite \(nan\)"):
        rloo_list([0.0, float("nan")])


EQUAL_VALUES = [4.2, 1e6 + 0.1, 0.1, -3.7, 1e-30, 3e-8, 1e30]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("value", EQUAL_VALUES)
def test_all_equal_group_gives_exact_zeros_in_every_dtype(dtype: torch.dtype,
                                                           value: float) -> None:
    # Before the shift, [4.2] * 16 in float32 gave +-0.32 and 1e6 + 0.1 gave +-0.97 to every
    # sample: the group mean was one rounding off, so its std was ~1e-7, not 0.
    for shape in ((16,), (3, 16), (5, 7)):
        r = torch.full(shape, value, dtype=dtype)
        for adv in (grpo_advantages(r), grpo_advantages(r, normalize_std=False),
                    grpo_advantages(r, eps=0.0), rloo_advantages(r)):
            assert adv.dtype == dtype
            assert torch.equal(adv, torch.zeros_like(r)), (value, shape, adv)


@pytest.mark.parametrize("value", EQUAL_VALUES)
def test_all_equal_group_gives_exact_zeros_in_the_list_forms(value: float) -> None:
    for g in (2, 7, 16):
        assert grpo_list([value] * g) == [0.0] * g
        assert grpo_list([value] * g, normalize_std=False) == [0.0] * g
        assert rloo_list([value] * g) == [0.0] * g


def test_equal_rows_are_zero_while_other_rows_keep_their_advantages() -> None:
    r = torch.tensor([[4.2] * 8, [4.2] * 7 + [5.2]], dtype=torch.float32)
    adv = grpo_advantages(r)
    assert torch.equal(adv[0], torch.zeros(8))
    expected = torch.tensor(_ref_grpo([4.2] * 7 + [5.2], True, 1e-6), dtype=torch.float32)
    torch.testing.assert_close(adv[1], expected)
    torch.testing.assert_close(rloo_advantages(r)[1],
                               torch.tensor(_ref_rloo([4.2] * 7 + [5.2]), dtype=torch.float32))


def test_a_large_common_offset_keeps_the_differences_in_float32() -> None:
    # 1e6 + {0, 1}: the shift by the first reward is exact, so float32 gives the float64 answer
    group = [1e6, 1e6 + 1.0, 1e6, 1e6 + 1.0]
    got = grpo_advantages(torch.tensor(group, dtype=torch.float32))
    want = torch.tensor(_ref_grpo(group, True, 1e-6), dtype=torch.float32)
    torch.testing.assert_close(got, want)
    assert grpo_list(group) == pytest.approx(_ref_grpo(group, True, 1e-6), abs=1e-12)
