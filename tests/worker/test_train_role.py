"""One optimizer step is the same however the batch is cut into micro-batches (long-tailed
lengths are trained in length-sorted micro-batches instead of padding all to the longest)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_train_group import assert_same, batch, fresh_store, step_msgs

from pivotflow.worker.train_role import TrainRole, micro_batches


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_give_the_same_step(tmp_path: Path, aggregation: str) -> None:
    states = []
    for budget in (10**6, 12):  # one batch; then about two sequences per micro-batch
        store = fresh_store(tmp_path / f"{aggregation}-{budget}")
        role = TrainRole(store, "policy", {"lr": 1e-2, "micro_batch_tokens": budget,
                                            "aggregation": aggregation})
        done = role.train(step_msgs(0, 1, 1, "")[0])
        states.append((role.state_dict(), done.stats["loss"]))
    (whole, loss_whole), (cut, loss_cut) = states
    assert_same(whole, cut)
    assert loss_whole == pytest.approx(loss_cut, rel=1e-5)
    assert len(micro_batches(batch(0), 12)) >= 3


def test_micro_batches_respect_the_budget_and_keep_every_sequence() -> None:
    seqs = batch(1)
    parts = micro_batches(seqs, 20)
    assert sorted(s.job_id for p in parts for s in p) == [s.job_id for s in seqs]
    for p in parts:
        width = max(len(s.prompt_ids) + len(s.response_ids) for s in p)
        assert len(p) == 1 or len(p) * width <= 20


@pytest.mark.parametrize(("clip_eps_high", "clipped_high"), [(None, True), (0.5, False)])
def test_clip_eps_high_reaches_the_loss(tmp_path: Path, clip_eps_high: float | None,
                                        clipped_high: bool) -> None:
    """DAPO's clip-higher from the graph's ``g.train(clip_eps_high=...)``: every token sampled
    at ratio e^0.3 = 1.35 to the policy now is clipped above under clip_eps 0.2 and not under
    an upper bound of 1.5."""
    import torch

    from pivotflow.worker.response_scoring import response_logprobs
    from pivotflow.worker.train_role import pack

    opts = {"lr": 1e-2} | ({} if clip_eps_high is None else {"clip_eps_high": clip_eps_high})
    role = TrainRole(fresh_store(tmp_path / "store"), "policy", opts)
    msg = step_msgs(0, 1, 1, "")[0]
    with torch.no_grad():  # the tokens' logprobs under the weights the step starts from
        for s in msg.seqs:
            now = response_logprobs(role.model, pack([s]))[0, : len(s.response_ids)]
            s.logprobs = (now - 0.3).tolist()
            s.advantage = 1.0  # (clipping above binds for positive advantages)
    stats = role.train(msg).stats
    assert (stats["clip_frac_high"] > 0.99) is clipped_high
    assert (stats["clip_frac_high"] == 0.0) is not clipped_high


@pytest.mark.parametrize(("dual_clip", "held"), [(None, False), (3.0, True)])
def test_dual_clip_reaches_the_loss(tmp_path: Path, dual_clip: float | None,
                                    held: bool) -> None:
    """``g.train(dual_clip=3)`` (verl's clip_ratio_c): tokens with a negative advantage that
    the policy now gives e^1.5 = 4.5 times the probability they were sampled with are held
    at the bound."""
    import torch

    from pivotflow.worker.response_scoring import response_logprobs
    from pivotflow.worker.train_role import pack

    opts = {"lr": 1e-2} | ({} if dual_clip is None else {"dual_clip": dual_clip})
    role = TrainRole(fresh_store(tmp_path / "store"), "policy", opts)
    msg = step_msgs(0, 1, 1, "")[0]
    with torch.no_grad():
        for s in msg.seqs:
            now = response_logprobs(role.model, pack([s]))[0, : len(s.response_ids)]
            s.logprobs = (now - 1.5).tolist()
            s.advantage = -1.0
    stats = role.train(msg).stats
    assert ("clip_frac_dual" in stats) is held
    if held:
        assert stats["clip_frac_dual"] > 0.99
        assert stats["pg_loss"] == pytest.approx(3.0, rel=1e-4)  # (-c * A on every token)


@pytest.mark.parametrize(("cap", "weight"), [(2.0, 1.3499), (1.2, 1.2)])
def test_the_decoupled_loss_weights_each_token_by_its_behavior_ratio(
        tmp_path: Path, cap: float, weight: float) -> None:
    """``g.train(decoupled_loss=True)``: tokens sampled at 0.3 nats below the policy now are
    weighted e^0.3 = 1.35 (or the cap), and nothing is clipped (the proximal policy is the
    step's own weights)."""
    import torch

    from pivotflow.worker.response_scoring import response_logprobs
    from pivotflow.worker.train_role import pack

    role = TrainRole(fresh_store(tmp_path / "store"), "policy",
                     {"lr": 1e-2, "decoupled_loss": True, "behavior_weight_cap": cap})
    msg = step_msgs(0, 1, 1, "")[0]
    with torch.no_grad():
        for s in msg.seqs:
            now = response_logprobs(role.model, pack([s]))[0, : len(s.response_ids)]
            s.logprobs = (now - 0.3).tolist()
    stats = role.train(msg).stats
    assert stats["behavior_weight_mean"] == pytest.approx(weight, rel=1e-3)
    assert stats["behavior_weight_capped"] == (1.0 if cap < 1.3 else 0.0)
    assert stats["clip_frac"] == 0.0


@pytest.mark.parametrize("entropy_coef", [0.0, 0.5])
def test_the_step_reports_the_policys_entropy(tmp_path: Path, entropy_coef: float) -> None:
    """Every step's stats carry the policy's entropy over the trained tokens, equal to the
    entropy of the model's own next-token distributions at those positions (computed here
    with torch.distributions, apart from the trainer's code); with ``entropy_coef`` the loss
    is the surrogate less that bonus."""
    import torch

    from pivotflow.worker.response_scoring import response_logits
    from pivotflow.worker.train_role import pack

    role = TrainRole(fresh_store(tmp_path / "store"), "policy",
                     {"lr": 1e-2, "entropy_coef": entropy_coef})
    msg = step_msgs(0, 1, 1, "")[0]
    with torch.no_grad():  # token-mean over the step's valid positions, before the update
        batch = pack(msg.seqs)
        dist = torch.distributions.Categorical(logits=response_logits(role.model, batch).float())
        valid = batch["mask"].bool()
        expected = float(dist.entropy()[valid].mean())
    stats = role.train(msg).stats
    assert stats["entropy"] == pytest.approx(expected, rel=1e-4)
    assert stats["loss"] == pytest.approx(stats["pg_loss"] - entropy_coef * expected, abs=1e-5)


def test_a_bad_entropy_coef_names_the_knob() -> None:
    from pivotflow.worker.train_config import check_train_options

    with pytest.raises(ValueError, match="entropy_coef must be a number >= 0, got -1"):
        check_train_options({"entropy_coef": -1})
    with pytest.raises(ValueError, match=r"top_entropy_quantile must be in \(0, 1\] \(1: every "
                                         r"token\), got 0"):
        check_train_options({"top_entropy_quantile": 0})


def test_a_step_on_the_top_entropy_quantile_trains_that_share_of_its_tokens(
        tmp_path: Path) -> None:
    """``top_entropy_quantile=0.2`` through a real trainer's step: the step reports the share
    of its valid tokens whose surrogate trained, about the quantile asked for."""
    role = TrainRole(fresh_store(tmp_path / "store"), "policy",
                     {"lr": 1e-2, "top_entropy_quantile": 0.2})
    stats = role.train(step_msgs(0, 1, 1, "")[0]).stats
    assert 0.0 < stats["entropy_kept"] <= 0.3


def test_the_entropy_metric_in_chunks_equals_it_whole(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Reported only (no bonus), the entropy is computed detached in chunks of positions; the
    chunks give what the whole tensor gives."""
    import torch

    from pivotflow.worker import response_scoring
    from pivotflow.worker.train_role import pack

    role = TrainRole(fresh_store(tmp_path / "store"), "policy", {})
    batch = pack(step_msgs(0, 1, 1, "")[0].seqs)
    with torch.no_grad():
        _, whole = response_scoring.response_logprobs_entropy(role.model, batch, "grad")
    monkeypatch.setattr(response_scoring, "ENTROPY_CHUNK", 3)
    logp, chunked = response_scoring.response_logprobs_entropy(role.model, batch, "report")
    assert logp.requires_grad and chunked is not None and not chunked.requires_grad
    assert whole is not None and torch.allclose(whole, chunked, atol=1e-6)
    assert whole.numel() > 3 * 2  # (several chunks)
