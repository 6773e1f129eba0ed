"""The clipped policy loss against hand-computed numbers and a plain-Python loop reference."""

from __future__ import annotations

import math
import random

import pytest
import torch

from pivotflow.errors import RLError
from pivotflow.rl import masked_mean, masked_sum, policy_loss

AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]

# The 2x3 example: ratios chosen so each clip case appears once (clip_eps 0.2).
# row 0, A=+1: rho 1.0 (inside), 1.5 (clipped high -> 1.2), 0.5 (below, not clipped for A>0)
# row 1, A=-2: rho 0.5 (clipped low -> 0.8), 1.5 (above, not clipped for A<0), 2.0 (masked)
RATIOS = [[1.0, 1.5, 0.5], [0.5, 1.5, 2.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
ADV = [1.0, -2.0]


def _example(requires_grad: bool = True) -> tuple[torch.Tensor, ...]:
    old = torch.tensor([[-0.5, -1.0, -2.0], [-0.3, -0.7, -1.1]])
    new = (old + torch.log(torch.tensor(RATIOS))).requires_grad_(requires_grad)
    return new, old, torch.tensor(ADV), torch.tensor(MASK)


def _ref_loss(new, old, adv, mask, eps_lo, eps_hi, aggregation, ref=None, kl_coef=0.0, est="k3"):  # type: ignore[no-untyped-def]
    """Straight loops over Python floats; returns (loss, clip_frac)."""
    per_seq, all_tokens, clipped_count = [], [], 0
    for i in range(len(new)):
        tokens = []
        for t in range(len(new[i])):
            if not mask[i][t]:
                continue
            rho = math.exp(new[i][t] - old[i][t])
            a = adv[i]
            surrogate = min(rho * a, min(max(rho, 1 - eps_lo), 1 + eps_hi) * a)
            if (a > 0 and rho > 1 + eps_hi) or (a < 0 and rho < 1 - eps_lo):
                clipped_count += 1
            loss = -surrogate
            if kl_coef:
                d = ref[i][t] - new[i][t]
                loss += kl_coef * (-d if est == "k1" else math.exp(d) - d - 1)
            tokens.append(loss)
        all_tokens += tokens
        if tokens:
            per_seq.append(
                sum(tokens) / len(tokens) if aggregation.endswith("mean") else sum(tokens)
            )
    if aggregation == "token-mean":
        total = sum(all_tokens) / len(all_tokens) if all_tokens else 0.0
    else:
        total = sum(per_seq) / len(per_seq) if per_seq else 0.0
    return total, clipped_count / max(len(all_tokens), 1)


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [("token-mean", 0.38), ("seq-mean-token-mean", 0.7), ("seq-mean-token-sum", 0.95)],
)
def test_hand_computed_2x3(aggregation: str, expected: float) -> None:
    # per-token losses: row 0 -> [-1.0, -1.2, -0.5], row 1 -> [1.6, 3.0, masked]
    # token-mean 1.9/5; seq-mean-token-mean (-0.9 + 2.3)/2; seq-mean-token-sum (-2.7 + 4.6)/2
    new, old, adv, mask = _example()
    loss, stats = policy_loss(new, old, adv, mask, aggregation=aggregation)  # type: ignore[arg-type]
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(0.4)
    assert stats["clip_frac_low"] == pytest.approx(0.2)
    assert stats["clip_frac_high"] == pytest.approx(0.2)
    assert stats["ratio_mean"] == pytest.approx(1.0)
    # k3 of KL(old || new): mean of rho - 1 - log(rho) over the 5 valid tokens
    assert stats["approx_kl"] == pytest.approx(0.1150728, abs=1e-6)
    assert stats["tokens"] == 5.0
    assert "kl_ref" not in stats


def test_hand_computed_clip_higher() -> None:
    # clip_eps_high 0.6: rho 1.5 with A=+1 is no longer clipped (loss -1.5, was -1.2)
    new, old, adv, mask = _example()
    loss, stats = policy_loss(new, old, adv, mask, clip_eps_high=0.6)
    assert loss.item() == pytest.approx(1.6 / 5, abs=1e-6)
    assert stats["clip_frac_high"] == 0.0
    assert stats["clip_frac_low"] == pytest.approx(0.2)


def test_hand_computed_dual_clip() -> None:
    # dual_clip 1.4: row 1's A=-2 token at rho 1.5 (loss 3.0) is held at 1.4 * 2 = 2.8, with no
    # gradient; its rho 0.5 token (loss 1.6, under the bound) and row 0 (A > 0) are unchanged
    new, old, adv, mask = _example()
    loss, stats = policy_loss(new, old, adv, mask, dual_clip=1.4)
    assert loss.item() == pytest.approx((1.9 - 0.2) / 5, abs=1e-6)
    assert stats["clip_frac_dual"] == pytest.approx(0.2)
    loss.backward()
    assert new.grad is not None and new.grad[1, 1] == 0.0
    # a bound above every ratio changes nothing (that token's gradient is back)
    new, old, adv, mask = _example()
    loss, stats = policy_loss(new, old, adv, mask, dual_clip=3.0)
    assert loss.item() == pytest.approx(0.38, abs=1e-6) and stats["clip_frac_dual"] == 0.0
    loss.backward()
    assert new.grad is not None and new.grad[1, 1] == pytest.approx(2 * 1.5 / 5)
    assert "clip_frac_dual" not in policy_loss(new, old, adv, mask)[1]
    for bad in (1.0, 0.5, float("inf")):
        with pytest.raises(RLError, match=r"^policy_loss: dual_clip must be > 1, got "):
            policy_loss(new, old, adv, mask, dual_clip=bad)


@pytest.mark.parametrize(
    ("estimator", "expected"),
    # one token has log(ref/new) = log 2: k3 = 2 - log 2 - 1 = 0.3068528, k1 = -log 2
    [("k3", 0.38 + 0.5 * 0.3068528 / 5), ("k1", 0.38 - 0.5 * 0.6931472 / 5)],
)
def test_hand_computed_kl_to_reference(estimator: str, expected: float) -> None:
    new, old, adv, mask = _example()
    ref = new.detach().clone()
    ref[0, 0] += math.log(2.0)
    ref[1, 2] = float("-inf")  # masked: must not matter
    loss, stats = policy_loss(
        new,
        old,
        adv,
        mask,
        ref_logprobs=ref,
        kl_coef=0.5,
        kl_estimator=estimator,  # type: ignore[arg-type]
    )
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    kl = 0.3068528 if estimator == "k3" else -0.6931472
    assert stats["kl_ref"] == pytest.approx(kl / 5, abs=1e-6)
    assert stats["kl_loss"] == pytest.approx(kl / 5, abs=1e-6)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize(
    ("eps_hi", "kl_coef", "est"),
    [(None, 0.0, "k3"), (0.28, 0.0, "k3"), (None, 0.1, "k3"), (0.28, 0.05, "k1")],
)
def test_matches_loop_reference_on_random_inputs(
    aggregation: str, eps_hi: float | None, kl_coef: float, est: str
) -> None:
    rng = random.Random(f"{aggregation}-{eps_hi}-{kl_coef}-{est}")  # str seeds are stable
    b, t = 5, 7
    old = [[rng.uniform(-3, -0.1) for _ in range(t)] for _ in range(b)]
    # log-ratios up to +-0.6 so that both clip sides are hit on most draws
    new = [[o + rng.uniform(-0.6, 0.6) for o in row] for row in old]
    ref = [[o + rng.uniform(-0.5, 0.5) for o in row] for row in old]
    adv = [rng.uniform(-2, 2) for _ in range(b)]
    mask = [[int(rng.random() < 0.7) for _ in range(t)] for _ in range(b)]
    mask[2] = [0] * t  # an empty row must be left out of the sequence means
    loss, stats = policy_loss(
        torch.tensor(new, dtype=torch.float64),
        torch.tensor(old, dtype=torch.float64),
        torch.tensor(adv, dtype=torch.float64),
        torch.tensor(mask, dtype=torch.bool),
        clip_eps=0.2,
        clip_eps_high=eps_hi,
        aggregation=aggregation,  # type: ignore[arg-type]
        ref_logprobs=torch.tensor(ref, dtype=torch.float64) if kl_coef else None,
        kl_coef=kl_coef,
        kl_estimator=est,  # type: ignore[arg-type]
    )
    hi = 0.2 if eps_hi is None else eps_hi
    want, clip_frac = _ref_loss(new, old, adv, mask, 0.2, hi, aggregation, ref, kl_coef, est)
    assert loss.item() == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert stats["clip_frac"] == pytest.approx(clip_frac, abs=1e-12)
    assert clip_frac > 0  # the draw exercises clipping, so the clip branches were compared


def test_gradient_flows_only_into_logprobs() -> None:
    new, old, adv, mask = _example()
    old.requires_grad_(True)
    adv.requires_grad_(True)
    ref = old.detach().clone().requires_grad_(True)
    loss, _ = policy_loss(new, old, adv, mask, ref_logprobs=ref, kl_coef=0.1)
    loss.backward()
    assert new.grad is not None and new.grad.abs().sum() > 0
    assert old.grad is None and adv.grad is None and ref.grad is None
    # masked position and clipped positions (gradient-free branch) get exactly zero gradient
    assert new.grad[1, 2] == 0.0
    lp, op, a, m = _example()
    policy_loss(lp, op, a, m)[0].backward()
    assert lp.grad is not None
    assert lp.grad[0, 1] == 0.0 and lp.grad[1, 0] == 0.0
    assert lp.grad[0, 0] != 0.0 and lp.grad[1, 1] != 0.0


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_zero_mask_gives_zero_loss_not_nan(aggregation: str) -> None:
    new = torch.full((2, 3), float("-inf"), requires_grad=True)  # garbage everywhere, all masked
    old = torch.full((2, 3), float("nan"))
    mask = torch.zeros(2, 3, dtype=torch.bool)
    loss, stats = policy_loss(
        new,
        old,
        torch.ones(2),
        mask,
        aggregation=aggregation,
        ref_logprobs=old,
        kl_coef=0.1,  # type: ignore[arg-type]
    )
    loss.backward()
    assert loss.item() == 0.0
    assert all(math.isfinite(v) for v in stats.values())
    assert new.grad is not None and torch.equal(new.grad, torch.zeros(2, 3))


def test_zero_mask_row_does_not_change_other_rows() -> None:
    new, old, adv, mask = _example()
    pad = torch.zeros(1, 3)
    loss_pad, _ = policy_loss(
        torch.cat([new, pad]),
        torch.cat([old, pad]),
        torch.cat([adv, torch.ones(1)]),
        torch.cat([mask, torch.zeros(1, 3, dtype=mask.dtype)]),
        aggregation="seq-mean-token-mean",
    )
    assert loss_pad.item() == pytest.approx(0.7, abs=1e-6)


def test_masked_helpers() -> None:
    x = torch.tensor([[1.0, float("nan"), 3.0], [float("inf"), 5.0, 6.0]])
    m = torch.tensor([[1, 0, 1], [0, 0, 0]])
    assert masked_sum(x, m).item() == 4.0
    assert masked_mean(x, m).item() == 2.0
    torch.testing.assert_close(masked_mean(x, m, dim=-1), torch.tensor([2.0, 0.0]))
    torch.testing.assert_close(masked_sum(x, m, dim=0), torch.tensor([1.0, 0.0, 3.0]))
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0


def test_bad_inputs_raise_rl_error() -> None:
    new, old, adv, mask = _example()
    with pytest.raises(RLError, match="old_logprobs has shape"):
        policy_loss(new, old[:, :2], adv, mask)
    with pytest.raises(RLError, match=r"advantages must be \[B\]"):
        policy_loss(new, old, adv[:1], mask)
    with pytest.raises(RLError, match="aggregation must be one of"):
        policy_loss(new, old, adv, mask, aggregation="sum")  # type: ignore[arg-type]
    with pytest.raises(RLError, match="needs ref_logprobs"):
        policy_loss(new, old, adv, mask, kl_coef=0.1)
    with pytest.raises(RLError, match="kl_estimator"):
        policy_loss(new, old, adv, mask, ref_logprobs=old, kl_estimator="k2")  # type: ignore[arg-type]
    with pytest.raises(RLError, match="clip_eps must be in"):
        policy_loss(new, old, adv, mask, clip_eps=0.0)
    with pytest.raises(RLError, match="logprobs must be"):
        policy_loss(new[0], old[0], adv, mask[0])


def _extreme_inputs(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Log-ratios of +-100 and +-1e4 (logprobs of -1e4 the sampler saw, or the trainer gives),
    beside ordinary tokens, with advantages of both signs."""
    old = torch.tensor([[-1.0, -1e4, -0.5, -2.0], [-100.0, -0.1, -1.0, -3.0],
                        [-1e4, -1e4, -0.7, -0.2]], dtype=dtype)
    new = torch.tensor([[-1e4, -1.0, -0.6, -2.1], [-0.1, -100.0, -1.0, -1e4],
                        [-1e4, -0.5, -0.7, -0.3]], dtype=dtype).requires_grad_(True)
    adv = torch.tensor([1.5, -2.0, -0.5], dtype=dtype)
    return new, old, adv, torch.ones(3, 4, dtype=torch.bool)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16,
                                   torch.float16])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_overflowing_log_ratios_give_a_finite_loss_and_gradient(dtype: torch.dtype,
                                                                aggregation: str) -> None:
    new, old, adv, mask = _extreme_inputs(dtype)
    ref = old.detach().clone().flip(0)  # log-ratios to the reference of +-1e4 too
    loss, stats = policy_loss(new, old, adv, mask, aggregation=aggregation,  # type: ignore[arg-type]
                              ref_logprobs=ref, kl_coef=0.1)
    loss.backward()
    assert new.grad is not None
    assert torch.isfinite(loss).item(), loss
    assert torch.isfinite(new.grad).all().item(), new.grad
    assert all(math.isfinite(v) for v in stats.values()), stats
    # the ordinary tokens (|log-ratio| < 20) still get their gradient
    assert (new.grad[0, 2] != 0).item() and (new.grad[0, 3] != 0).item()


def test_ratios_inside_the_clamp_are_unchanged() -> None:
    # log-ratios up to +-19.9: the same loss and gradient as the unclamped formula
    rng = random.Random(7)
    old = [[rng.uniform(-30, -0.01) for _ in range(6)] for _ in range(4)]
    new = [[o + rng.uniform(-19.9, 19.9) for o in row] for row in old]
    adv = [rng.uniform(-2, 2) for _ in range(4)]
    mask = [[1] * 6 for _ in range(4)]
    want, _ = _ref_loss(new, old, adv, mask, 0.2, 0.2, "token-mean")
    lp = torch.tensor(new, dtype=torch.float64, requires_grad=True)
    loss, _ = policy_loss(lp, torch.tensor(old, dtype=torch.float64),
                          torch.tensor(adv, dtype=torch.float64), torch.tensor(mask))
    assert loss.item() == pytest.approx(want, rel=1e-12)
    loss.backward()
    # the unclamped surrogate's gradient: -A * rho / n where the unclipped branch is chosen
    assert lp.grad is not None
    for i in range(4):
        for t in range(6):
            rho = math.exp(new[i][t] - old[i][t])
            a = adv[i]
            chosen = rho * a <= min(max(rho, 0.8), 1.2) * a
            g = -a * rho / 24 if chosen else 0.0
            assert lp.grad[i, t].item() == pytest.approx(g, rel=1e-9, abs=1e-15)


def test_a_clamped_ratio_is_exp_20() -> None:
    new = torch.tensor([[0.0, -100.0]], requires_grad=True)
    old = torch.tensor([[-100.0, 0.0]])
    _, stats = policy_loss(new, old, torch.tensor([1.0]), torch.ones(1, 2))
    assert stats["ratio_mean"] == pytest.approx((math.exp(20) + math.exp(-20)) / 2, rel=1e-6)


def test_the_decoupled_loss_with_behavior_equal_to_old_is_plain_ppo() -> None:
    new, old, adv, mask = _example()
    plain, stats = policy_loss(new, old, adv, mask)
    same, dstats = policy_loss(new, old, adv, mask, behavior_logprobs=old.clone())
    assert same.item() == pytest.approx(plain.item(), abs=1e-7)
    assert dstats["behavior_weight_mean"] == pytest.approx(1.0)
    assert dstats["behavior_weight_capped"] == 0.0
    assert dstats["clip_frac"] == stats["clip_frac"]


def test_the_decoupled_gradient_is_the_truncated_behavior_weight_times_the_advantage() -> None:
    """Proximal = the weights the step starts from (ratio 1, the clip inactive): each token's
    gradient is -min(pi_prox / pi_behavior, cap) * A / n_tokens under token-mean."""
    new, _, adv, mask = _example()
    behavior = new.detach() - torch.tensor([[0.1, 1.0, -0.5], [0.0, 2.0, 0.3]])
    loss, stats = policy_loss(new, new.detach(), adv, mask, behavior_logprobs=behavior,
                              behavior_weight_cap=2.0)
    loss.backward()
    w = torch.clamp(torch.exp(new.detach() - behavior), max=2.0)
    n = mask.sum()
    expected = -(w * adv.unsqueeze(-1) * mask) / n
    assert torch.allclose(new.grad, expected, atol=1e-6)
    assert stats["clip_frac"] == 0.0
    valid = mask.bool()
    assert stats["behavior_weight_mean"] == pytest.approx(w[valid].mean().item(), rel=1e-6)
    # e^1.0 and e^2.0 are over the cap of 2: two of the five valid tokens
    assert stats["behavior_weight_capped"] == pytest.approx(2 / 5)


def test_a_bad_behavior_weight_cap_or_shape_is_an_rl_error() -> None:
    new, old, adv, mask = _example()
    with pytest.raises(RLError, match="behavior_weight_cap must be > 0, got 0.0"):
        policy_loss(new, old, adv, mask, behavior_logprobs=old, behavior_weight_cap=0.0)
    with pytest.raises(RLError, match=r"behavior_logprobs has shape \(2, 2\)"):
        policy_loss(new, old, adv, mask, behavior_logprobs=old[:, :2])


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_entropy_is_reported_as_the_loss_aggregates_and_its_bonus_is_subtracted(
        aggregation: str) -> None:
    """verl's ``actor/entropy`` and ``entropy_coeff``: the reported entropy is the valid
    positions' entropies reduced as the loss is (a masked position's entropy counts nowhere),
    and an entropy bonus lowers the loss by exactly ``coef`` times it."""
    new, old, adv, mask = _example()
    ent = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 99.0]])  # 99 sits under the mask
    plain, _ = policy_loss(new, old, adv, mask, aggregation=aggregation)  # type: ignore[arg-type]
    loss, stats = policy_loss(new, old, adv, mask, aggregation=aggregation,  # type: ignore[arg-type]
                              entropy=ent, entropy_coef=0.01)
    expected = 15 / 5 if aggregation == "token-mean" else (2.0 + 4.5) / 2
    assert stats["entropy"] == pytest.approx(expected)
    assert loss.item() == pytest.approx(plain.item() - 0.01 * expected, abs=1e-6)
    reported, _ = policy_loss(new, old, adv, mask, entropy=ent)  # coef 0: reported only
    assert reported.item() == pytest.approx(
        policy_loss(new, old, adv, mask)[0].item(), abs=1e-7)


def test_an_entropy_bonus_step_raises_the_entropy() -> None:
    """The bonus's gradient goes through the entropy: one gradient step on logits with a
    zero advantage and ``entropy_coef`` > 0 makes each distribution flatter."""
    from pivotflow.engines.torch.model import token_entropy, token_logprobs

    torch.manual_seed(0)
    logits = (torch.randn(2, 3, 11) * 3).requires_grad_(True)
    targets = torch.randint(0, 11, (2, 3))
    logp = token_logprobs(logits, targets)
    before = token_entropy(logits)
    loss, _ = policy_loss(logp, logp.detach(), torch.zeros(2), torch.ones(2, 3),
                          entropy=before, entropy_coef=1.0)
    loss.backward()
    with torch.no_grad():
        after = token_entropy(logits - 0.5 * logits.grad)
    assert bool((after > before.detach()).all())


def test_a_bad_entropy_coef_is_an_rl_error() -> None:
    new, old, adv, mask = _example()
    with pytest.raises(RLError, match="entropy_coef must be >= 0, got -0.1"):
        policy_loss(new, old, adv, mask, entropy=old, entropy_coef=-0.1)
    with pytest.raises(RLError, match="entropy_coef > 0 needs entropy"):
        policy_loss(new, old, adv, mask, entropy_coef=0.1)
    with pytest.raises(RLError, match=r"entropy has shape \(2, 2\)"):
        policy_loss(new, old, adv, mask, entropy=old[:, :2])


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_top_entropy_quantile_trains_only_the_highest_entropy_tokens(aggregation: str) -> None:
    """TRL's ``top_entropy_quantile``: the surrogate of the valid tokens under the batch's
    (1 - q) entropy quantile is zeroed, not dropped: the loss is the full loss with those
    tokens' terms set to 0 (same denominators), their gradient is 0, the others' unchanged;
    q = 1 is the plain loss; a masked position's entropy (99) is no part of the quantile."""
    new, old, adv, mask = _example()
    ent = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 99.0]])  # valid (MASK): 1 2 3 4 5
    agg = aggregation
    loss, stats = policy_loss(new, old, adv, mask, aggregation=agg, entropy=ent,  # type: ignore[arg-type]
                              top_entropy_quantile=0.4)
    loss.backward()
    kept = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])  # the quantile at 0.6 is 4.0
    assert stats["entropy_kept"] == pytest.approx(2 / 5)
    full_new = new.detach().clone().requires_grad_(True)
    full, _ = policy_loss(full_new, old, adv, mask, aggregation=agg)  # type: ignore[arg-type]
    full.backward()
    assert full_new.grad is not None and new.grad is not None
    assert torch.allclose(new.grad, full_new.grad * kept)
    # the kept tokens' clipped terms (ratio = RATIOS, clip 0.2) over the same denominators
    ratio, a = torch.tensor(RATIOS), torch.tensor(ADV).unsqueeze(1)
    terms = -torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a)
    if aggregation == "token-mean":
        expected = float((terms * kept).sum() / 5)
    else:
        expected = float(((terms * kept)[0, :3].sum() / 3 + (terms * kept)[1, :2].sum() / 2) / 2)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    plain, _ = policy_loss(new.detach(), old, adv, mask, aggregation=agg, entropy=ent,  # type: ignore[arg-type]
                           top_entropy_quantile=1.0)
    assert plain.item() == pytest.approx(full.item(), abs=1e-7)


def test_a_bad_top_entropy_quantile_is_an_rl_error() -> None:
    new, old, adv, mask = _example()
    for q in (0.0, 1.5, float("nan")):
        with pytest.raises(RLError, match=r"top_entropy_quantile must be in \(0, 1\], got"):
            policy_loss(new, old, adv, mask, entropy=old, top_entropy_quantile=q)
    with pytest.raises(RLError, match="top_entropy_quantile < 1 needs entropy"):
        policy_loss(new, old, adv, mask, top_entropy_quantile=0.2)


def test_gspo_takes_each_sequences_geometric_mean_ratio() -> None:
    """``importance_sampling_level="sequence"`` (GSPO): every token of a sequence carries
    exp(mean of its token log-ratios); row 0's ratios 1.0, 1.5, 0.5 have the geometric mean
    0.9086 (inside 0.8-1.2), row 1's 0.5, 1.5 (its third token masked) 0.8660."""
    new, old, adv, mask = _example()
    _, stats = policy_loss(new, old, adv, mask, importance_sampling_level="sequence",
                           aggregation="seq-mean-token-mean")
    s0, s1 = (1.0 * 1.5 * 0.5) ** (1 / 3), (0.5 * 1.5) ** 0.5
    assert stats["ratio_mean"] == pytest.approx((3 * s0 + 2 * s1) / 5, rel=1e-6)
    assert stats["clip_frac"] == 0.0  # both inside [0.8, 1.2]
    # the tokens' own ratios still give approx_kl (how far the policy moved, per token)
    _, token_stats = policy_loss(new, old, adv, mask)
    assert stats["approx_kl"] == pytest.approx(token_stats["approx_kl"], rel=1e-6)


def test_gspos_gradient_is_the_sequence_ratios() -> None:
    """GSPO's gradient (its eq. 10), with seq-mean-token-mean over B sequences: each valid
    token of sequence i gets -A_i * s_i / (|y_i| * B) when s_i is inside the clip, and 0 when
    the clip is active for the sequence (all its tokens at once)."""
    new, old, adv, mask = _example()
    loss, _ = policy_loss(new, old, adv, mask, importance_sampling_level="sequence",
                          aggregation="seq-mean-token-mean")
    loss.backward()
    assert new.grad is not None
    s0, s1 = (1.0 * 1.5 * 0.5) ** (1 / 3), (0.5 * 1.5) ** 0.5
    expected = [[-1.0 * s0 / (3 * 2)] * 3, [2.0 * s1 / (2 * 2)] * 2 + [0.0]]
    torch.testing.assert_close(new.grad, torch.tensor(expected))
    # clip tightly (GSPO's 3e-4 / 4e-4): row 0 (A > 0, s < 1) stays unclipped below, row 1
    # (A < 0, s < 1 - eps) is clipped whole: no gradient for any of its tokens
    new.grad = None
    loss, stats = policy_loss(new, old, adv, mask, importance_sampling_level="sequence",
                              aggregation="seq-mean-token-mean", clip_eps=3e-4,
                              clip_eps_high=4e-4)
    loss.backward()
    assert new.grad is not None
    torch.testing.assert_close(new.grad[1], torch.zeros(3))
    assert bool((new.grad[0] != 0).all())
    assert stats["clip_frac"] == pytest.approx(2 / 5)


def test_gspo_on_one_token_sequences_is_ppo() -> None:
    """A one-token sequence's geometric mean is its token's ratio: the two levels agree."""
    g = torch.Generator().manual_seed(3)
    old = torch.randn(6, 1, generator=g) - 1.0
    new = (old + 0.3 * torch.randn(6, 1, generator=g)).requires_grad_()
    adv, mask = torch.randn(6, generator=g), torch.ones(6, 1)
    results = []
    for level in ("token", "sequence"):
        new.grad = None
        loss, _ = policy_loss(new, old, adv, mask, importance_sampling_level=level)  # type: ignore[arg-type]
        loss.backward()
        assert new.grad is not None
        results.append((loss.detach(), new.grad.clone()))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])


def test_a_bad_importance_sampling_level_is_an_error() -> None:
    from pivotflow.worker.train_config import check_train_options

    new, old, adv, mask = _example()
    with pytest.raises(RLError, match="importance_sampling_level must be one of"):
        policy_loss(new, old, adv, mask, importance_sampling_level="group")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="importance_sampling_level must be one of"):
        check_train_options({"importance_sampling_level": "seq"})
