"""What a step's totals count (``pivotflow/controller/train_tokens.py``): a loss mask's zeros
leave tokens, and their advantage, out of the step."""

from __future__ import annotations

from pivotflow.controller.train_tokens import carries_signal, valid_tokens
from pivotflow.protocol import TrainSeq


def seq(advantage: float, n: int, mask: list[int] | None = None) -> TrainSeq:
    return TrainSeq(job_id=0, prompt_ids=[1, 2], response_ids=[3] * n, logprobs=[-1.0] * n,
                    versions=[0] * n, advantage=advantage, loss_mask=mask or [])


def test_a_masked_out_sequence_counts_no_token_and_carries_no_signal() -> None:
    assert valid_tokens(seq(1.0, 3)) == 3
    assert valid_tokens(seq(1.0, 3, [1, 0, 1])) == 2
    assert valid_tokens(seq(1.0, 3, [0, 0, 0])) == 0
    assert carries_signal([seq(0.0, 3), seq(-0.5, 2)])
    assert not carries_signal([seq(0.0, 3), seq(0.0, 2)])
    # the only nonzero advantages sit on responses the mask leaves out (truncated, say)
    assert not carries_signal([seq(0.0, 3), seq(1.0, 2, [0, 0]), seq(-1.0, 1, [0])])
    assert carries_signal([seq(0.0, 3), seq(1.0, 2, [0, 1])])
