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
