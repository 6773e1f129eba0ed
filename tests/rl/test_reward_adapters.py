"""verl's and TRL's reward functions as stage functions (``rl/reward_adapters.py``): called with
their own argument names on a sample's fields, their returns read as the library reads them,
and a return neither library would accept a one-line error. (examples/dataset_prompts.py runs a
verl compute_score through a whole run: tests/test_learning.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from pivotflow.graph import fn_reads
from pivotflow.rl.reward_adapters import trl_reward, verl_reward

FIELDS = {"prompt": "2+2=", "prompt_ids": [5, 6], "answer": "4", "completion": "4",
          "response_ids": [9, 1], "logprobs": [-0.1, -0.2], "data_source": "openai/gsm8k",
          "extra_info": {"index": 3}, "level": 2}


def test_verl_compute_score_gets_its_own_names() -> None:
    seen: dict[str, Any] = {}

    def compute_score(data_source: str, solution_str: str, ground_truth: str,
                      extra_info: dict | None = None) -> float:
        seen.update(data_source=data_source, solution_str=solution_str,
                    ground_truth=ground_truth, extra_info=extra_info)
        return 1.0 if solution_str.strip() == ground_truth else 0.0

    fn = verl_reward(compute_score)
    assert fn(**FIELDS) == 1.0
    assert seen == {"data_source": "openai/gsm8k", "solution_str": "4", "ground_truth": "4",
                    "extra_info": {"index": 3}}
    assert fn_reads(fn, "here", "reward") == {"completion", "answer"}  # the rest if there
    assert fn(completion="5", answer="4") == 0.0 and seen["data_source"] is None
    assert fn.__name__ == "verl_compute_score"


def test_a_verl_dict_gives_its_score_and_the_keys_asked_for() -> None:
    fn = verl_reward(lambda **kw: {"score": 0.5, "acc": True, "pred": "4"}, extra=("acc",))
    assert fn(**FIELDS) == {"reward": 0.5, "acc": True}
    assert verl_reward(lambda **kw: True)(**FIELDS) == 1.0  # (a bool is a number to verl)


@pytest.mark.parametrize(("returned", "error"), [
    ({"acc": 1}, r"^verl reward <lambda> returned a dict without 'score' \(keys \['acc'\]\)$"),
    ({"score": 1}, r"^verl reward <lambda> returned no 'acc', which extra= names"),
    ("1.0", r"^reward <lambda> returned str '1.0', not a number$"),
    (float("nan"), r"^reward <lambda> returned float nan, not a number$"),
])
def test_a_verl_return_it_cannot_read_is_a_one_line_error(returned: object,
                                                          error: str) -> None:
    with pytest.raises(ValueError, match=error):
        verl_reward(lambda **kw: returned, extra=("acc",))(**FIELDS)


def test_a_trl_reward_func_gets_a_batch_of_one_with_the_columns_as_lists() -> None:
    seen: dict[str, Any] = {}

    def accuracy(prompts: list, completions: list, answer: list, **kwargs: Any) -> list:
        seen.update(prompts=prompts, completions=completions, answer=answer, **kwargs)
        return [1.0 if c == a else 0.0 for c, a in zip(completions, answer, strict=True)]

    fn = trl_reward(accuracy)
    assert fn(**FIELDS) == 1.0
    assert seen["prompts"] == ["2+2="] and seen["completions"] == ["4"]
    assert seen["level"] == [2] and seen["completion_ids"] == [[9, 1]]
    assert not {"prompt_ids", "response_ids", "logprobs"} & set(seen)  # per-token: left out
    assert fn_reads(fn, "here", "reward") == {"prompt", "completion"}


def test_a_trl_none_reads_zero_and_is_counted_and_a_bad_return_is_an_error() -> None:
    fn = trl_reward(lambda prompts, completions, **_: [None])
    assert fn(**FIELDS) == 0.0 and fn(**FIELDS) == 0.0
    assert fn.not_applicable == 2  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"^TRL reward <lambda> returned float 1.0: a list of "
                                         r"one reward per completion \(1 here\)$"):
        trl_reward(lambda prompts, completions, **_: 1.0)(**FIELDS)
