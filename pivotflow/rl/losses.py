"""Policy-gradient losses on per-token logprobs: the PPO/GRPO clipped surrogate with an optional KL
penalty against a reference policy, PPO's clipped value loss for a learned critic, and the masked
reductions they are built from.

Shapes: ``B`` sequences (samples) by ``T`` response positions. ``mask`` marks the positions that
are real response tokens (prompt and padding positions are 0). Masked positions contribute nothing
to the loss or its gradient, whatever values (even inf or NaN) the inputs hold there.
"""

from __future__ import annotations

from typing import Literal

import torch

from pivotflow.defaults import AGGREGATIONS, KL_ESTIMATORS, RATIO_LEVELS
from pivotflow.errors import RLError

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
KLEstimator = Literal["k1", "k3"]
RatioLevel = Literal["token", "sequence"]

_AGGREGATIONS = AGGREGATIONS
_KL_ESTIMATORS = KL_ESTIMATORS

# Bound of |log pi_theta - log pi_old| (and of the k3 KL's log-ratio) before exp(): verl's
# ``compute_policy_loss`` and ``kl_penalty`` clamp at the same +-20.
LOG_RATIO_CLAMP = 20.0


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` over the positions where ``mask`` is nonzero, over ``dim`` (all dims if None).

    Masked positions are replaced by 0 before summing (not multiplied by 0), so an inf or NaN
    there cannot leak into the result or its gradient.
    """
    picked = torch.where(mask.bool(), x, torch.zeros_like(x))
    return picked.sum() if dim is None else picked.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is nonzero; 0 where no position is.

    ``mask`` is read as boolean. An all-zero mask (or mask row, with ``dim``) gives 0, not NaN.
    """
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k3"
) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from the log-probs of sampled tokens.

    Schulman, "Approximating KL Divergence" (2020, http://joschu.net/blog/kl-approx.html), with
    ``d = log pi_ref(x) - log pi_theta(x)``::

        k1 = -d                      (unbiased, high variance, can be negative)
        k3 = exp(d) - d - 1          (unbiased, low variance, always >= 0; GRPO's choice, eq. 4)

    For k3, ``d`` is clamped to +-``LOG_RATIO_CLAMP`` first (exp would overflow beyond ~88).

    Raises:
        RLError: ``estimator`` is not "k1" or "k3".
    """
    d = ref_logprobs - logprobs
    if estimator == "k1":
        return -d
    if estimator == "k3":
        # exp() of a log-ratio past ~88 is inf in float32: clamped as the importance ratio is
        d = torch.clamp(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return torch.exp(d) - d - 1.0
    raise RLError(f"kl_penalty: estimator must be one of {_KL_ESTIMATORS}, got {estimator!r}")


def _aggregate(per_token: torch.Tensor, mask: torch.Tensor, aggregation: str) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar by ``aggregation`` (see ``policy_loss``)."""
    if aggregation == "token-mean":
        return masked_mean(per_token, mask)
    lengths = mask.sum(dim=-1)
    if aggregation == "seq-mean-token-mean":
        per_seq = masked_sum(per_token, mask, dim=-1) / lengths.clamp(min=1).to(per_token.dtype)
    else:  # seq-mean-token-sum
        per_seq = masked_sum(per_token, mask, dim=-1)
    # Sequences with no valid token are left out of the mean over sequences, so padding rows
    # neither dilute the loss nor turn it into 0/0.
    return masked_mean(per_seq, lengths > 0)


def _check_shapes(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    behavior_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> None:
    """Raise RLError unless all inputs agree with ``logprobs``' ``[B, T]`` shape."""
    if logprobs.dim() != 2:
        raise RLError(f"policy_loss: logprobs must be [B, T], got {tuple(logprobs.shape)}")
    shape = logprobs.shape
    named = {"old_logprobs": old_logprobs, "mask": mask}
    if ref_logprobs is not None:
        named["ref_logprobs"] = ref_logprobs
    if behavior_logprobs is not None:
        named["behavior_logprobs"] = behavior_logprobs
    if entropy is not None:
        named["entropy"] = entropy
    for name, t in named.items():
        if t.shape != shape:
            raise RLError(
                f"policy_loss: {name} has shape {tuple(t.shape)}, "
                f"expected logprobs' shape {tuple(shape)}"
            )
    # [B]: one advantage per sequence (GRPO, RLOO); [B, T]: one per token, as logprobs (GAE's,
    # from a learned critic)
    if advantages.shape not in (shape[:1], shape):
        raise RLError(
            f"policy_loss: advantages must be [B] = [{shape[0]}] or [B, T] = "
            f"[{shape[0]}, {shape[1]}], got {tuple(advantages.shape)}"
        )


def _token_advantages(advantages: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``advantages`` shaped to multiply ``[B, T]`` per-token ratios.

    A ``[B]`` advantage is broadcast along its sequence (every token shares it). A ``[B, T]``
    one is used per token, its masked positions zeroed first, as every other input is: GAE
    writes nothing meaningful in padding, and an inf or NaN there would make ``ratio * A`` NaN.
    The masked reductions and the zeroed logprobs already keep that NaN out of the loss and
    the gradient; zeroing it here keeps it out of the arithmetic altogether, so no later
    change to how positions are combined can let it through.
    """
    if advantages.dim() == 1:
        return advantages.unsqueeze(-1)
    return torch.where(valid, advantages, torch.zeros_like(advantages))


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    aggregation: Aggregation = "token-mean",
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    behavior_logprobs: torch.Tensor | None = None,
    behavior_weight_cap: float = 2.0,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    importance_sampling_level: RatioLevel = "token",
    top_entropy_quantile: float = 1.0,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO/GRPO clipped surrogate loss with an optional KL penalty to a reference policy.

    Per valid token t of sequence i, with ratio ``rho = exp(logprobs - old_logprobs)`` (the
    log-ratio clamped to +-``LOG_RATIO_CLAMP`` first, so it never overflows) and the
    advantage ``A_it`` (PPO, Schulman et al. 2017, arXiv:1707.06347; GRPO, Shao et al.
    2024, arXiv:2402.03300, eq. 3)::

        l_it = -min(rho * A_it, clip(rho, 1 - clip_eps, 1 + clip_eps_high) * A_it)
               + kl_coef * KL_it                 (KL_it from ``kl_penalty``, only if kl_coef > 0)

    ``A_it = A_i``, the sequence's advantage, for ``[B]`` advantages (GRPO, RLOO: one outcome
    reward per sequence); ``[B, T]`` advantages give each token its own (PPO with a learned
    critic: GAE, verl's and OpenRLHF's ``advantage_estimator=gae``).

    ``clip_eps_high`` (default: ``clip_eps``) is DAPO's clip-higher (Yu et al. 2025,
    arXiv:2503.14476): a larger upper bound lets low-probability tokens grow, against entropy
    collapse.

    ``dual_clip`` c > 1 (dual-clip PPO, Ye et al. 2020, arXiv:1912.09729; verl's
    ``clip_ratio_c``, 3 there by default, OpenRLHF's ``dual_clip``) bounds a negative-advantage
    token's loss by ``-c * A_it``: where the policy already gives a bad token c times the
    probability it was sampled with, PPO's surrogate grows with the ratio without bound (the
    clip binds only below for A < 0), and one stale or off-policy token could dominate the
    step; past c its gradient is 0. None (the default) leaves the loss as it is.

    With ``importance_sampling_level="sequence"`` every token of sequence i takes GSPO's
    sequence ratio (Zheng et al. 2025, arXiv:2507.18071, eq. 7; TRL's
    ``importance_sampling_level``, verl's ``loss_mode="gspo"``),
    ``s_i = exp(mean_t (logprobs - old_logprobs))``, the geometric mean of its tokens' ratios,
    clipped as one: a sequence is in or out of the trust region whole, and one token's extreme
    ratio cannot dominate its gradient. Written per token as ``sg[s_i] * pi(t) / sg[pi(t)]``
    (GSPO-token, eq. 13), so its gradient is ``s_i`` times each token's score: with
    ``"seq-mean-token-mean"`` the loss is GSPO's exactly. GSPO clips far tighter than PPO
    (3e-4 and 4e-4 in the paper), since ``s_i`` is a per-token average.

    With ``behavior_logprobs`` (the decoupled loss of AReaL, Fu et al. 2025, arXiv:2505.24298,
    after Hilton et al. 2021's decoupled PPO), ``old_logprobs`` are the *proximal* policy's
    and ``behavior_logprobs`` those the rollout sampled with; each token's ``l_it`` is weighted
    by ``w_it = min(exp(old - behavior), behavior_weight_cap)``, detached (truncated importance
    sampling, verl's ``tis_imp_ratio_cap``): the clip keeps the update near the proximal policy,
    and the weight corrects for the tokens having come from an older (or another engine's)
    policy without letting one rare token's weight run away.

    With ``entropy`` (each position's entropy of the policy's next-token distribution) the stats
    report it aggregated as the loss is (verl's ``actor/entropy``: the figure that shows entropy
    collapse, which clip-higher is against), and ``entropy_coef`` > 0 subtracts ``entropy_coef``
    times it from the loss (an entropy bonus, verl's ``entropy_coeff``; 0, the default, as in
    verl and DAPO, leaves the loss as it is). ``top_entropy_quantile`` q < 1 (TRL's knob, after
    Wang et al. 2025, "Beyond the 80/20 rule", arXiv:2506.01939: the high-entropy "forking"
    tokens carry RL's gain) keeps the surrogate of the valid tokens whose entropy is at or above
    the (1 - q) quantile of the batch's valid entropies and zeroes the rest, which still count in
    the aggregation's denominators, as TRL masks them; the KL and entropy terms keep every
    token. The per-token losses are reduced by ``aggregation``:

    * ``"token-mean"``: sum over all valid tokens of the batch / their count (DAPO's token-level
      loss, so long answers weigh by their length).
    * ``"seq-mean-token-mean"``: mean over each sequence's tokens, then over sequences (the GRPO
      paper's sample-level loss).
    * ``"seq-mean-token-sum"``: sum over each sequence's tokens, then mean over sequences.

    Sequences without any valid token are left out of the sequence means; an all-zero mask gives a
    loss of 0 (still attached to the graph), never NaN. Gradients flow only into ``logprobs``:
    ``old_logprobs``, ``advantages`` and ``ref_logprobs`` are detached.

    Args:
        logprobs: ``[B, T]`` log-probs of the sampled tokens under the policy being trained.
        old_logprobs: ``[B, T]`` log-probs under the policy that generated the tokens.
        advantages: ``[B]`` one advantage per sequence, or ``[B, T]`` one per token (masked
            positions may hold anything, inf and NaN included).
        mask: ``[B, T]`` nonzero where the position is a response token to train on.
        clip_eps: lower (and, by default, upper) clip range, > 0.
        clip_eps_high: upper clip range, > 0; None means ``clip_eps``.
        aggregation: how per-token losses become one scalar (above).
        ref_logprobs: ``[B, T]`` log-probs under the reference policy; needed when kl_coef > 0.
        kl_coef: weight of the KL penalty (GRPO's beta), >= 0.
        kl_estimator: "k1" or "k3" (see ``kl_penalty``).
        behavior_logprobs: ``[B, T]`` log-probs the rollout sampled with (decoupled loss; None:
            ``old_logprobs`` are those, plain PPO).
        behavior_weight_cap: the truncation of the behavior weight, > 0.
        entropy: ``[B, T]`` the policy's entropy at each position (None: not reported).
        entropy_coef: weight of the entropy bonus, >= 0 (> 0 needs ``entropy``, with its graph).
        importance_sampling_level: "token" (PPO's ratio per token) or "sequence" (GSPO's).
        top_entropy_quantile: the share of the highest-entropy valid tokens whose surrogate
            trains, in (0, 1]; 1 trains all (< 1 needs ``entropy``).
        dual_clip: the bound c > 1 of a negative-advantage token's ratio in the loss (None:
            no bound).

    Returns:
        ``(loss, stats)``: the scalar loss and floats ``pg_loss`` (surrogate part), ``clip_frac``
        (share of valid tokens where clipping is active), ``clip_frac_low``, ``clip_frac_high``,
        ``ratio_mean``, ``approx_kl`` (k3 estimate of KL(old || new)), ``tokens`` (valid token
        count), ``kl_ref`` and ``kl_loss`` when ``ref_logprobs`` is given, and
        ``behavior_weight_mean`` and ``behavior_weight_capped`` (share of valid tokens at the cap)
        when ``behavior_logprobs`` is, ``entropy`` when ``entropy`` is, and ``entropy_kept``
        (the share of valid tokens whose surrogate trained) when ``top_entropy_quantile`` < 1,
        and ``clip_frac_dual`` (share of valid tokens at the dual clip's bound) with
        ``dual_clip``.

    Raises:
        RLError: a shape disagrees, a knob is out of range, ``aggregation`` or ``kl_estimator`` is
            unknown, or kl_coef > 0 without ``ref_logprobs``.
    """
    eps_low = clip_eps
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if not (0.0 < eps_low < 1.0):
        raise RLError(f"policy_loss: clip_eps must be in (0, 1), got {clip_eps}")
    if eps_high <= 0.0:
        raise RLError(f"policy_loss: clip_eps_high must be > 0, got {clip_eps_high}")
    if aggregation not in _AGGREGATIONS:
        raise RLError(
            f"policy_loss: aggregation must be one of {_AGGREGATIONS}, got {aggregation!r}"
        )
    if kl_estimator not in _KL_ESTIMATORS:
        raise RLError(
            f"policy_loss: kl_estimator must be one of {_KL_ESTIMATORS}, got {kl_estimator!r}"
        )
    if kl_coef < 0.0:
        raise RLError(f"policy_loss: kl_coef must be >= 0, got {kl_coef}")
    if kl_coef > 0.0 and ref_logprobs is None:
        raise RLError("policy_loss: kl_coef > 0 needs ref_logprobs")
    if not 0.0 < behavior_weight_cap < float("inf"):
        raise RLError(f"policy_loss: behavior_weight_cap must be > 0, got {behavior_weight_cap}")
    if not 0.0 <= entropy_coef < float("inf"):
        raise RLError(f"policy_loss: entropy_coef must be >= 0, got {entropy_coef}")
    if entropy_coef > 0.0 and entropy is None:
        raise RLError("policy_loss: entropy_coef > 0 needs entropy")
    if not 0.0 < top_entropy_quantile <= 1.0:
        raise RLError("policy_loss: top_entropy_quantile must be in (0, 1], got "
                      f"{top_entropy_quantile}")
    if top_entropy_quantile < 1.0 and entropy is None:
        raise RLError("policy_loss: top_entropy_quantile < 1 needs entropy")
    if dual_clip is not None and not 1.0 < dual_clip < float("inf"):
        raise RLError(f"policy_loss: dual_clip must be > 1, got {dual_clip}")
    if importance_sampling_level not in RATIO_LEVELS:
        raise RLError(f"policy_loss: importance_sampling_level must be one of {RATIO_LEVELS}, "
                      f"got {importance_sampling_level!r}")
    _check_shapes(logprobs, old_logprobs, advantages, mask, ref_logprobs, behavior_logprobs,
                  entropy)

    valid = mask.bool()
    # bf16/fp16 logprobs are scored in float32: fp16's exp overflows past 11 (its max is 65504)
    work = torch.promote_types(logprobs.dtype, torch.float32)
    zeros = torch.zeros_like(logprobs, dtype=work)
    # Zero the masked inputs before any exp: a padded -inf would otherwise make a NaN gradient
    # through exp() even where the result is thrown away.
    new = torch.where(valid, logprobs.to(work), zeros)
    old = torch.where(valid, old_logprobs.detach().to(work), zeros)
    adv = _token_advantages(advantages.detach().to(work), valid)

    # A real model's numbers reach here: a token the sampler drew at logprob -1e4, or weights
    # far from the ones that generated it, give log-ratios of +-100s, and exp() of them is inf
    # (a loss of inf, a gradient of inf * 0 = NaN). Clamped at +-LOG_RATIO_CLAMP as verl does
    # (exp(20) ~ 4.9e8, finite in float32); inside it nothing changes, and beyond it the
    # token's gradient is 0 (clamp), where clipping already stops most of them.
    token_log_ratio = torch.clamp(new - old, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    log_ratio = token_log_ratio
    if importance_sampling_level == "sequence":
        # GSPO: each token carries its sequence's mean log-ratio as its value and its own
        # log-probability's gradient (new - sg[new] is 0 with gradient 1)
        seq_log_ratio = masked_mean(new - old, valid, dim=-1).detach().unsqueeze(-1)
        log_ratio = torch.clamp(new - new.detach() + seq_log_ratio,
                                -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    per_token_pg = -torch.minimum(unclipped, clipped)
    dual_active = None
    if dual_clip is not None:  # (a negative advantage's loss at most -c * A: no gradient past)
        bound = -dual_clip * adv
        dual_active = (adv < 0) & (bound < per_token_pg)
        per_token_pg = torch.where(dual_active, bound, per_token_pg)
    behavior_w = None
    if behavior_logprobs is not None:
        behav = torch.where(valid, behavior_logprobs.detach().to(work), zeros)
        behavior_w = torch.exp(torch.clamp(old - behav, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        behavior_w = torch.clamp(behavior_w, max=behavior_weight_cap)
        per_token_pg = per_token_pg * behavior_w
    kept = None
    if top_entropy_quantile < 1.0 and entropy is not None and bool(valid.any()):
        ent_valid = entropy.detach().to(torch.float32)[valid]
        threshold = torch.quantile(ent_valid, 1.0 - top_entropy_quantile)
        kept = valid & (entropy.detach().to(torch.float32) >= threshold)
        per_token_pg = per_token_pg * kept.to(work)
    pg_loss = _aggregate(per_token_pg, valid, aggregation)
    loss = pg_loss

    with torch.no_grad():
        # (GSPO's ratio is the sequence's; PPO's is already the token's own)
        token_ratio = ratio if log_ratio is token_log_ratio else token_log_ratio.exp()
        # Clipping is active where the clipped branch is the smaller (chosen, gradient-free) one.
        active = clipped < unclipped
        stats = {
            "pg_loss": pg_loss.detach(),
            "clip_frac": masked_mean(active.to(ratio.dtype), valid),
            "clip_frac_low": masked_mean((active & (ratio < 1.0)).to(ratio.dtype), valid),
            "clip_frac_high": masked_mean((active & (ratio > 1.0)).to(ratio.dtype), valid),
            "ratio_mean": masked_mean(ratio, valid),
            # (per token whatever the ratio's level: how far the policy moved)
            "approx_kl": masked_mean(token_ratio - 1.0 - token_log_ratio, valid),
            "tokens": valid.sum().to(ratio.dtype),
        }
        if kept is not None:
            stats["entropy_kept"] = masked_mean(kept.to(ratio.dtype), valid)
        if dual_active is not None:
            stats["clip_frac_dual"] = masked_mean(dual_active.to(ratio.dtype), valid)
        if behavior_w is not None:
            stats["behavior_weight_mean"] = masked_mean(behavior_w, valid)
            stats["behavior_weight_capped"] = masked_mean(
                (behavior_w >= behavior_weight_cap).to(ratio.dtype), valid)

    if ref_logprobs is not None:
        ref = torch.where(valid, ref_logprobs.detach().to(work), zeros)
        per_token_kl = kl_penalty(new, ref, kl_estimator)
        kl_loss = _aggregate(per_token_kl, valid, aggregation)
        if kl_coef > 0.0:
            loss = loss + kl_coef * kl_loss
        with torch.no_grad():
            stats["kl_ref"] = masked_mean(per_token_kl, valid)
            stats["kl_loss"] = kl_loss.detach()

    if entropy is not None:
        ent = _aggregate(torch.where(valid, entropy.to(work), zeros), valid, aggregation)
        if entropy_coef > 0.0:
            loss = loss - entropy_coef * ent
        stats["entropy"] = ent.detach()

    # One device-to-host transfer for all stats instead of one sync per number.
    names = list(stats)
    values = torch.stack([stats[n].to(work) for n in names]).tolist()
    return loss, dict(zip(names, values, strict=True))


def _check_value_inputs(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                        mask: torch.Tensor, clip: float | None, aggregation: str) -> None:
    """Raise RLError unless ``value_loss``'s inputs are ``[B, T]`` alike and its knobs known."""
    if values.dim() != 2:
        raise RLError(f"value_loss: values must be [B, T], got {tuple(values.shape)}")
    for name, t in {"old_values": old_values, "returns": returns, "mask": mask}.items():
        if t.shape != values.shape:
            raise RLError(f"value_loss: {name} has shape {tuple(t.shape)}, "
                          f"expected values' shape {tuple(values.shape)}")
    # (written so that a NaN clip fails too)
    if clip is not None and not clip > 0.0:
        raise RLError(f"value_loss: clip must be None or > 0, got {clip}")
    if aggregation not in _AGGREGATIONS:
        raise RLError(
            f"value_loss: aggregation must be one of {_AGGREGATIONS}, got {aggregation!r}"
        )


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None = 0.2,
    aggregation: Aggregation = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss: regresses a learned critic's ``V`` onto the (GAE) returns.

    Per valid token (PPO, Schulman et al. 2017, arXiv:1707.06347; the clipped form is that of
    OpenAI's baselines, as verl's ``compute_value_loss`` and OpenRLHF's ``ValueLoss`` use it)::

        V_clip = old + clamp(values - old, -clip, clip)
        l_it   = 0.5 * max((values - returns)^2, (V_clip - returns)^2)

    A trust region on the critic, as the ratio clip is one on the policy: once ``values`` has
    moved more than ``clip`` from ``old_values``, the max picks the clipped branch whenever it
    is the worse fit, and that branch has no gradient, so one batch cannot drag the critic far
    from where it was when the advantages were computed. The max keeps it pessimistic: moving
    past the region is never rewarded with a smaller loss. With ``clip=None`` it is the plain
    ``0.5 * (values - returns)^2``. ``clip`` is in the returns' units, not a ratio (verl's
    ``cliprange_value`` is 0.5; OpenRLHF's ``value_clip`` 0.2 or 0.5 by release), so it wants
    rescaling with the rewards.

    The per-token losses are reduced by ``aggregation`` exactly as ``policy_loss``'s are, so a
    padding row or an all-zero mask gives 0, never NaN. Gradients flow only into ``values``:
    ``old_values`` and ``returns`` are detached. Masked positions may hold anything (inf and NaN
    included) without reaching the loss or its gradient.

    Args:
        values: ``[B, T]`` the critic's values now, with their graph.
        old_values: ``[B, T]`` the critic's values when the advantages were computed.
        returns: ``[B, T]`` the regression targets (GAE's ``A_t + V_t``).
        mask: ``[B, T]`` nonzero where the position is a response token to train on.
        clip: how far ``values`` may move from ``old_values`` before clipping, > 0 (None: no
            clipping).
        aggregation: as for ``policy_loss``.

    Returns:
        ``(loss, stats)``: the scalar loss and floats ``value_loss``, ``value_clip_frac`` (share
        of valid tokens where the clipped branch is the larger one, i.e. the one the loss takes;
        0 with ``clip=None``), ``value_mean`` and ``return_mean`` (masked means) and
        ``value_error`` (masked mean of ``|values - returns|``).

    Raises:
        RLError: a shape disagrees, ``clip`` is not None or > 0, or ``aggregation`` is unknown.
    """
    _check_value_inputs(values, old_values, returns, mask, clip, aggregation)
    valid = mask.bool()
    # float32 at least, as in policy_loss: a squared error of bf16 values loses most of its bits
    work = torch.promote_types(values.dtype, torch.float32)
    zeros = torch.zeros_like(values, dtype=work)
    # Zeroed before any arithmetic (not multiplied by the mask afterwards): a NaN at a padded
    # position would otherwise give the gradient NaN * 0 = NaN there.
    new = torch.where(valid, values.to(work), zeros)
    old = torch.where(valid, old_values.detach().to(work), zeros)
    ret = torch.where(valid, returns.detach().to(work), zeros)

    unclipped = (new - ret) ** 2
    if clip is None:
        per_token = 0.5 * unclipped
        clip_active = torch.zeros_like(valid)
    else:
        clipped = (old + torch.clamp(new - old, -clip, clip) - ret) ** 2
        per_token = 0.5 * torch.maximum(unclipped, clipped)
        # verl's vf_clipfrac: where the clipped branch is strictly larger, so chosen (its
        # gradient is 0: the value sits outside the trust region on the wrong side)
        clip_active = clipped > unclipped
    loss = _aggregate(per_token, valid, aggregation)

    with torch.no_grad():
        stats = {
            "value_loss": loss.detach(),
            "value_clip_frac": masked_mean(clip_active.to(work), valid),
            "value_mean": masked_mean(new, valid),
            "return_mean": masked_mean(ret, valid),
            "value_error": masked_mean((new - ret).abs(), valid),
        }
        # One device-to-host transfer for all stats, as in policy_loss.
        names = list(stats)
        numbers = torch.stack([stats[n] for n in names]).tolist()
    return loss, dict(zip(names, numbers, strict=True))
