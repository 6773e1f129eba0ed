"""DAPO's overlong handling as group functions: the soft length penalty on the reward and the
truncated responses' loss mask (``pivotflow/rl/group_fns.py``)."""

from __future__ import annotations

import pytest

from pivotflow.rl.group_fns import mask_truncated, overlong_penalty


def test_the_penalty_is_zero_before_the_buffer_and_linear_through_it() -> None:
    shape = overlong_penalty(max_tokens=100, buffer_tokens=20, factor=1.0)
    lengths = [10, 80, 85, 90, 100, 120]  # (past the cap: as at the cap)
    got = shape(reward=[1.0] * 6, response_ids=[[7] * n for n in lengths])["reward"]
    assert got == pytest.approx([1.0, 1.0, 0.75, 0.5, 0.0, 0.0])
    half = overlong_penalty(100, 20, factor=0.5)
    assert half(reward=[0.0], response_ids=[[7] * 90])["reward"] == pytest.approx([-0.25])


def test_a_failed_judgement_stays_failed_and_the_rest_of_the_fields_pass() -> None:
    shape = overlong_penalty(10, 5)
    got = shape(reward=[None, 1.0], response_ids=[[1] * 10, [1] * 10], advantage=[0, 0])
    assert got == {"reward": [None, 0.0]}


@pytest.mark.parametrize(("args", "error"), [
    ((100, 0), "buffer_tokens must be in [1, max_tokens=100], got 0"),
    ((100, 101), "buffer_tokens must be in [1, max_tokens=100], got 101"),
    ((100, 10, -1.0), "factor must be >= 0, got -1.0"),
])
def test_bad_settings_are_one_line_errors(args: tuple, error: str) -> None:
    with pytest.raises(ValueError, match="overlong_penalty: ") as err:
        overlong_penalty(*args)
    assert error in str(err.value)


def test_a_truncated_response_leaves_the_loss_and_the_others_keep_their_mask() -> None:
    got = mask_truncated(finish_reason=["stop", "length", "stop"],
                         response_ids=[[1, 2], [1, 2, 3], [4]])
    assert got == {"loss_mask": [[1, 1], [0, 0, 0], [1]]}
    # multi-turn: an observation's zeros stay; a cut trajectory is left out whole
    turns = mask_truncated(finish_reason=["stop", "length"], response_ids=[[1, 2, 3], [1, 2]],
                           loss_mask=[[1, 0, 1], [1, 0]])
    assert turns == {"loss_mask": [[1, 0, 1], [0, 0]]}
