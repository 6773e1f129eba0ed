"""Group functions for graphs: advantages and filters over one prompt's group of samples.

They take sample fields by name (lists over the group) and ``**_`` for the rest, as every stage
function does. A sample whose reward is None (a failed judgement) gets advantage 0: it adds no
gradient, and the failure is already counted by the controller. ``gae_advantage`` is the one
per-sample function here (a ``g.map`` stage): GAE needs a learned critic's values, not the group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pivotflow.rl.list_math import gae_list, grpo_list, rloo_list


def _with_failures(reward: list[float | None], fn: Any) -> dict[str, list[float]]:
    scored = [(i, r) for i, r in enumerate(reward) if r is not None]
    adv = [0.0] * len(reward)
    if len(scored) >= 2:
        for (i, _), a in zip(scored, fn([float(r) for _, r in scored]), strict=True):
            adv[i] = a
    return {"advantage": adv}


def grpo_advantage(reward: list[float | None], **_: Any) -> dict[str, list[float]]:
    """GRPO: (r - mean) / (std + eps) within the group."""
    return _with_failures(reward, grpo_list)


def grpo_advantage_no_std(reward: list[float | None], **_: Any) -> dict[str, list[float]]:
    """Dr. GRPO: r - mean within the group (no std normalisation)."""
    return _with_failures(reward, lambda r: grpo_list(r, normalize_std=False))


def rloo_advantage(reward: list[float | None], **_: Any) -> dict[str, list[float]]:
    """RLOO: r_i minus the mean of the other samples' rewards."""
    return _with_failures(reward, rloo_list)


def gae_advantage(gamma: float = 1.0, lam: float = 1.0,
                  kl_coef: float = 0.0) -> Callable[..., dict[str, list[float]]]:
    """PPO with a learned critic: per-token GAE advantages and returns for one sample, as a
    per-sample function (verl's and OpenRLHF's ``advantage_estimator=gae``)::

        g.map("gae", gae_advantage(), writes=["advantage", "returns"])

    It reads ``reward`` (the sequence's), ``values`` (the critic's V before each response token)
    and ``response_ids``. The reward is placed on the last response token and every other token
    rewards 0, as verl and OpenRLHF place an outcome reward, then ``list_math.gae_list`` runs
    with ``V = 0`` after the last token. It writes ``advantage`` (one per response token, for
    ``policy_loss``'s ``[B, T]`` advantages) and ``returns`` (the critic's targets, for
    ``value_loss``).

    ``gamma = lam = 1`` (the defaults, as verl's for LLM PPO; OpenRLHF's are ``gamma=1``,
    ``lambd=0.95``) telescopes GAE to ``A_t = R - V_t``: every token's advantage is the outcome
    less what the critic expected before it. Lower ``lam`` trades that variance for the
    critic's bias. The advantages are not
    whitened here: verl and OpenRLHF normalise them over the whole batch, which one sample
    cannot see, so the trainer does it.

    With ``kl_coef`` > 0 every token also rewards ``-kl_coef * (logprob - ref_logprob)``, the
    k1 estimate of its KL to the reference model (verl's ``use_kl_in_reward``, OpenRLHF's
    ``init_kl_coef``: PPO's KL in the reward, where GRPO puts it in the loss); it then reads
    ``logprobs`` and ``ref_logprobs`` too, so a ``reference`` stage must come before it.

    A failed judgement (reward None) gets advantages of 0.0 and returns equal to its values:
    no policy gradient, and no value loss while the critic still predicts those values (its
    target is its own prediction), since the failure is already counted by the controller and
    the critic has nothing to learn from a missing reward.

    Raises:
        ValueError: ``gamma`` or ``lam`` is outside [0, 1], or ``kl_coef`` < 0 (here);
            ``values`` and ``response_ids`` differ in length (from the stage function).
    """
    _check_gamma_kl("gae_advantage", gamma, kl_coef)
    if not 0.0 <= lam <= 1.0:  # (a NaN fails too)
        raise ValueError(f"gae_advantage: lam must be in [0, 1], got {lam}")

    def advantages_of(reward: float | None, values: list[float], response_ids: list[int],
                      token_rewards: list[float] | None) -> dict[str, list[float]]:
        if len(values) != len(response_ids):
            raise ValueError(f"gae_advantage: {len(values)} values for "
                             f"{len(response_ids)} response tokens")
        v = [float(x) for x in values]
        if reward is None:
            return {"advantage": [0.0] * len(v), "returns": v}
        rewards = _with_outcome(float(reward), len(v), token_rewards)
        advantages, returns = gae_list(rewards, v, gamma, lam)
        return {"advantage": advantages, "returns": returns}

    def gae(reward: float | None, values: list[float], response_ids: list[int],
            **_: Any) -> dict[str, list[float]]:
        return advantages_of(reward, values, response_ids, None)

    gae.__name__ = f"gae_advantage({gamma}, {lam})"
    if not kl_coef:
        return gae

    def gae_kl(reward: float | None, values: list[float], response_ids: list[int],
               logprobs: list[float], ref_logprobs: list[float],
               **_: Any) -> dict[str, list[float]]:
        kl = _kl_token_rewards(kl_coef, logprobs, ref_logprobs, len(response_ids),
                               "gae_advantage")
        return advantages_of(reward, values, response_ids, kl)

    gae_kl.__name__ = f"gae_advantage({gamma}, {lam}, kl_coef={kl_coef})"
    return gae_kl


def _kl_token_rewards(kl_coef: float, logprobs: list[float], ref_logprobs: list[float],
                      tokens: int, who: str) -> list[float]:
    """Each token's reward ``-kl_coef * (logprob - ref_logprob)`` (k1: the KL in the reward)."""
    if not len(logprobs) == len(ref_logprobs) == tokens:
        raise ValueError(f"{who}: {len(logprobs)} logprobs and {len(ref_logprobs)} "
                         f"ref_logprobs for {tokens} response tokens")
    return [-kl_coef * (lp - ref) for lp, ref in zip(logprobs, ref_logprobs, strict=True)]


def _with_outcome(outcome: float, tokens: int,
                  token_rewards: list[float] | None) -> list[float]:
    """Each token's reward: ``token_rewards`` (0 without), the sequence's outcome added on the
    last token, as verl and OpenRLHF place it (an empty response has no token to carry it)."""
    rewards = list(token_rewards) if token_rewards is not None else [0.0] * tokens
    if rewards:
        rewards[-1] += outcome
    return rewards


def _returns_to_go(outcome: float, tokens: int, gamma: float,
                   token_rewards: list[float] | None) -> list[float]:
    """Each token's discounted sum of the rewards from it on (GAE with every value 0 and lam
    1)."""
    return gae_list(_with_outcome(outcome, tokens, token_rewards), [0.0] * tokens, gamma, 1.0)[0]


def _check_gamma_kl(who: str, gamma: float, kl_coef: float) -> None:
    if not 0.0 <= gamma <= 1.0:  # (a NaN fails too)
        raise ValueError(f"{who}: gamma must be in [0, 1], got {gamma}")
    if not 0.0 <= kl_coef < float("inf"):
        raise ValueError(f"{who}: kl_coef must be >= 0, got {kl_coef}")


def reinforce_pp_advantage(gamma: float = 1.0,
                           kl_coef: float = 0.0) -> Callable[..., dict[str, list[float]]]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262; OpenRLHF's ``advantage_estimator=reinforce``),
    as a per-sample stage function::

        g.map("advantage", reinforce_pp_advantage(kl_coef=0.01), writes=["advantage"])

    No critic and no groups: each token's advantage is its return to go, the sequence's reward
    on the last token plus, with ``kl_coef`` > 0, every token's ``-kl_coef * (logprob -
    ref_logprob)`` (the KL in the reward; it then reads ``logprobs`` and ``ref_logprobs``, so a
    ``reference`` stage must come before it). The baseline is the whole batch's: the
    controller whitens a step's per-token advantages (``g.train``'s ``whiten_advantages``, on
    by default), as REINFORCE++ normalises them globally. A failed judgement (reward None)
    gets advantages of 0.0."""
    who = "reinforce_pp_advantage"
    _check_gamma_kl(who, gamma, kl_coef)

    def advantages_of(reward: float | None, tokens: int,
                      kl: list[float] | None) -> dict[str, list[float]]:
        if reward is None:
            return {"advantage": [0.0] * tokens}
        return {"advantage": _returns_to_go(float(reward), tokens, gamma, kl)}

    def reinforce_pp(reward: float | None, response_ids: list[int],
                     **_: Any) -> dict[str, list[float]]:
        return advantages_of(reward, len(response_ids), None)

    def reinforce_pp_kl(reward: float | None, response_ids: list[int], logprobs: list[float],
                        ref_logprobs: list[float], **_: Any) -> dict[str, list[float]]:
        n = len(response_ids)
        return advantages_of(reward, n, _kl_token_rewards(kl_coef, logprobs, ref_logprobs,
                                                          n, who))

    fn = reinforce_pp_kl if kl_coef else reinforce_pp
    fn.__name__ = f"reinforce_pp_advantage({gamma}, kl_coef={kl_coef})"
    return fn


def reinforce_pp_baseline_advantage(
        gamma: float = 1.0, kl_coef: float = 0.0) -> Callable[..., dict[str, list[list[float]]]]:
    """REINFORCE++-baseline (Hu 2025; OpenRLHF's ``advantage_estimator=reinforce_baseline``), as
    a group stage function::

        g.group("advantage", reinforce_pp_baseline_advantage(), writes=["advantage"])

    Each reward less its group's mean (over the samples judged: a failed judgement, reward
    None, gets advantages of 0.0 and takes no part), then as :func:`reinforce_pp_advantage`:
    returns to go per token (with the KL in the reward when ``kl_coef`` > 0), whitened over the
    step's batch by the controller. Unlike GRPO no group's standard deviation divides them: the
    batch's does, so a group whose rewards barely differ is not blown up."""
    who = "reinforce_pp_baseline_advantage"
    _check_gamma_kl(who, gamma, kl_coef)

    def advantages_of(reward: list[float | None], tokens: list[int],
                      kl: list[list[float]] | None) -> dict[str, list[list[float]]]:
        scored = [float(r) for r in reward if r is not None]
        mean = sum(scored) / len(scored) if scored else 0.0
        out = []
        for i, (r, n) in enumerate(zip(reward, tokens, strict=True)):
            out.append([0.0] * n if r is None else
                       _returns_to_go(float(r) - mean, n, gamma, None if kl is None else kl[i]))
        return {"advantage": out}

    def baseline(reward: list[float | None], response_ids: list[list[int]],
                 **_: Any) -> dict[str, list[list[float]]]:
        return advantages_of(reward, [len(ids) for ids in response_ids], None)

    def baseline_kl(reward: list[float | None], response_ids: list[list[int]],
                    logprobs: list[list[float]], ref_logprobs: list[list[float]],
                    **_: Any) -> dict[str, list[list[float]]]:
        tokens = [len(ids) for ids in response_ids]
        kl = [_kl_token_rewards(kl_coef, lp, ref, n, who)
              for lp, ref, n in zip(logprobs, ref_logprobs, tokens, strict=True)]
        return advantages_of(reward, tokens, kl)

    fn = baseline_kl if kl_coef else baseline
    fn.__name__ = f"reinforce_pp_baseline_advantage({gamma}, kl_coef={kl_coef})"
    return fn


def has_signal(reward: list[float | None], **_: Any) -> bool:
    """Keep a group only if its rewards differ (DAPO's dynamic sampling): an all-equal group
    has zero advantages and teaches nothing."""
    scored = {r for r in reward if r is not None}
    return len(scored) > 1


def overlong_penalty(max_tokens: int, buffer_tokens: int,
                     factor: float = 1.0) -> Callable[..., dict[str, list[float | None]]]:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13; verl's
    ``overlong_buffer``), as a group function that rewrites ``reward``: a response longer than
    ``max_tokens - buffer_tokens`` loses ``factor`` times the share of the buffer it ran into,
    down to ``-factor`` at ``max_tokens`` (and past it). Put it after the reward and before the
    advantage::

        g.group("overlong", overlong_penalty(4096, 512), writes=["reward"])

    As responses grow over a run, more of them reach the cap (``response_clip_ratio`` in the
    step records); this makes the policy pay for the length before the cap cuts it, without
    treating a cut response as wrong. A failed judgement (reward None) stays None. A multi-turn
    response counts its observation tokens too."""
    if not 1 <= buffer_tokens <= max_tokens:
        raise ValueError(f"overlong_penalty: buffer_tokens must be in [1, max_tokens={max_tokens}]"
                         f", got {buffer_tokens}")
    if not 0 <= factor < float("inf"):
        raise ValueError(f"overlong_penalty: factor must be >= 0, got {factor}")
    expected = max_tokens - buffer_tokens

    def overlong(reward: list[float | None], response_ids: list[list[int]],
                 **_: Any) -> dict[str, list[float | None]]:
        out: list[float | None] = []
        for r, ids in zip(reward, response_ids, strict=True):
            over = max(0, len(ids) - expected) / buffer_tokens
            out.append(None if r is None else r - factor * min(1.0, over))
        return {"reward": out}

    overlong.__name__ = f"overlong_penalty({max_tokens}, {buffer_tokens}, {factor})"
    return overlong


def mask_truncated(finish_reason: list[str | None], response_ids: list[list[int]],
                   **fields: Any) -> dict[str, list[list[int]]]:
    """DAPO's overlong filtering, as a group function that writes ``loss_mask``: a response the
    length limit cut (``finish_reason`` "length") is left out of the loss, so a truncated answer
    is neither rewarded nor punished for where the cut fell; the others keep their mask (a
    multi-turn one its observation zeros). Put it before the train stage::

        g.group("mask", mask_truncated, writes=["loss_mask"])

    Its tokens count nowhere in the step (``train_tokens``): with token-mean aggregation the
    rest of the batch is averaged without them."""
    masks = fields.get("loss_mask") or [None] * len(response_ids)
    out = []
    for reason, ids, mask in zip(finish_reason, response_ids, masks, strict=True):
        keep = mask if mask else [1] * len(ids)
        out.append([0] * len(ids) if reason == "length" else list(keep))
    return {"loss_mask": out}
