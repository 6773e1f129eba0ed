"""verl's and TRL's reward functions as stage functions (``rl/reward_adapters.py``): called with
their own argument names on a sample's fields, their returns read as the library reads them,
and a return neither library would accept a one-line error. (examples/dataset_prompts.py runs a
verl compute_score through a whole run: tests/test_learning.py.)"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest
import torch

from pivotflow.graph import fn_reads
from pivotflow.rl.reward_adapters import trl_reward, verl_reward

FIELDS = {"prompt": "2+2=", "prompt_ids": [5, 6], "answer": "4", "completion": "4",
          "response_ids": [9, 1], "logprobs": [-0.1, -0.2], "data_source": "openai/gsm8k",
          "extra_info": {"index": 3}, "level": 2}


def resolved(out: Any) -> Any:
    """What the controller writes: an adapter over an async function returns a coroutine,
    which the controller awaits on its loop (controller/async_calls.py)."""
    assert inspect.iscoroutine(out)
    return asyncio.run(out)


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

    async def compute_async(**kw: Any) -> dict:
        return {"score": 0.5, "acc": False}

    assert resolved(verl_reward(compute_async, extra=("acc",))(**FIELDS)) == {"reward": 0.5,
                                                                              "acc": False}


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


def test_a_verl_batch_compute_score_is_called_once_on_the_group() -> None:
    """verl's batch reward manager's signature: plural names, a list of numbers or dicts."""
    calls: list[dict[str, Any]] = []

    def compute_scores(data_sources: list, solution_strs: list, ground_truths: list,
                       extra_infos: list) -> list:
        calls.append({"data_sources": data_sources, "extra_infos": extra_infos})
        return [{"score": float(s == t), "acc": s == t} if i else 0.25
                for i, (s, t) in enumerate(zip(solution_strs, ground_truths, strict=True))]

    fn = verl_reward(compute_scores, extra=("acc",), batch=True)
    group = {"completion": ["4", "4", "5"], "answer": ["4"] * 3, "level": [2] * 3}
    assert fn(**group) == {"reward": [0.25, 1.0, 0.0], "acc": [None, True, False]}
    assert calls == [{"data_sources": [None] * 3, "extra_infos": [None] * 3}]  # one call
    assert fn_reads(fn, "here", "reward") == {"completion", "answer"}
    async def async_scores(solution_strs: list, **_: Any) -> list:  # verl's reward loop's kind
        return [len(s) for s in solution_strs]

    assert resolved(verl_reward(async_scores, batch=True)(**group)) == {"reward": [1.0] * 3}
    with pytest.raises(ValueError, match=r"^verl batch reward <lambda> returned list \[1.0\]: "
                                         r"a list of one score per response \(3 here\)$"):
        verl_reward(lambda **kw: [1.0], batch=True)(**group)


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


def test_trl_rewards_are_summed_with_their_weights_leaving_out_those_that_do_not_apply() -> None:
    """TRL's reward_weights and nansum: a None leaves its term out; all None is unscorable,
    which is a failed reward here (None: out of the group's baseline, advantage 0)."""
    def fmt(completions: list, **_: Any) -> list:
        return [0.5 if c.strip().isdigit() else 0.0 for c in completions]

    def exact(completions: list, answer: list, **_: Any) -> list:
        return [None if a is None else float(c == a) for c, a in zip(completions, answer,
                                                                      strict=True)]

    fn = trl_reward([fmt, exact], weights=[2.0, 0.5], each=True)
    assert fn(**FIELDS) == {"reward": 2.0 * 0.5 + 0.5 * 1.0, "reward_fmt": 0.5,
                            "reward_exact": 1.0}
    assert fn(**{**FIELDS, "answer": None}) == {"reward": 1.0, "reward_fmt": 0.5,
                                                "reward_exact": None}
    assert trl_reward(exact)(**{**FIELDS, "answer": None}) is None
    assert trl_reward([fmt, exact])(**FIELDS) == 1.5 and fn.__name__ == "trl_fmt_exact"


def test_a_trl_group_reward_calls_each_function_once_on_the_whole_group() -> None:
    calls: list[int] = []

    def length(prompts: list, completions: list, completion_ids: list, level: list,
               trainer_state: Any, **_: Any) -> list:
        calls.append(len(completions))
        assert level == [2, 2, 2] and trainer_state.global_step == 3
        return [float(len(ids)) for ids in completion_ids]

    group = {"prompt": ["2+2="] * 3, "completion": ["4", "44", "x"], "answer": ["4"] * 3,
             "response_ids": [[1], [1, 2], [3, 4, 5]], "level": [2, 2, 2],
             "versions": [[3], [4, 4], [3, 4, 4]], "logprobs": [[-0.1]] * 3}
    fn = trl_reward(length, group=True, each=True)
    assert fn(**group) == {"reward": [1.0, 2.0, 3.0], "reward_length": [1.0, 2.0, 3.0]}
    assert calls == [3]  # one batch, not three
    assert fn_reads(fn, "here", "reward") == {"prompt", "completion"}


def test_a_chat_prompt_gives_trl_its_completion_as_an_assistant_message() -> None:
    seen: dict[str, Any] = {}

    def look(prompts: list, completions: list, **_: Any) -> list:
        seen.update(prompts=prompts, completions=completions)
        return [1.0]

    chat = [{"role": "user", "content": "2+2?"}]
    trl_reward(look)(**{**FIELDS, "prompt": chat})
    assert seen == {"prompts": [chat], "completions": [[{"role": "assistant", "content": "4"}]]}
    # a prefilled assistant turn is the completion's start, as TRL gives it
    prefill = [*chat, {"role": "assistant", "content": "The sum is "}]
    trl_reward(look)(**{**FIELDS, "prompt": prefill})
    assert seen == {"prompts": [chat],
                    "completions": [[{"role": "assistant", "content": "The sum is 4"}]]}


def test_two_trl_functions_of_one_name_write_two_fields() -> None:
    fn = trl_reward([lambda completions, **_: [1.0], lambda completions, **_: [2.0]],
                    each=True)
    assert fn(**FIELDS) == {"reward": 3.0, "reward_lambda": 1.0, "reward_lambda_1": 2.0}


@pytest.mark.parametrize(("funcs", "weights", "error"), [
    ([], None, r"^trl_reward: no reward function given$"),
    (["Qwen/Qwen2.5-0.5B-RM"], None, r"^trl_reward: reward function 0 is str "
                                     r"'Qwen/Qwen2.5-0.5B-RM'; a reward model runs as "
                                     r"g.reward_model\(...\), not inside a stage$"),
    ([torch.nn.Linear(1, 1)], None, r"^trl_reward: reward function 0 is Linear "),
    ([len, len], [1.0], r"^trl_reward: 1 weights for 2 reward functions$"),
    ([len], [float("inf")], r"^trl_reward: weight inf is not a finite number$"),
])
def test_what_trl_reward_is_given_is_checked_when_the_graph_is_built(
        funcs: list, weights: list | None, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        trl_reward(funcs, weights)


def test_a_trl_return_it_cannot_read_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match=r"^TRL reward lambda returned float 1.0: a list of "
                                         r"one reward per completion \(1 here\)$"):
        trl_reward(lambda prompts, completions, **_: 1.0)(**FIELDS)
    with pytest.raises(ValueError, match=r"^TRL reward f returned list \[1.0, 2.0\]: a list of "
                                         r"one reward per completion \(1 here\)$"):
        def f(completions: list, **_: Any) -> list:
            return [1.0, 2.0]
        trl_reward(f)(**FIELDS)
    with pytest.raises(ValueError, match=r"^reward lambda returned str 'high', not a number$"):
        trl_reward(lambda completions, **_: ["high"])(**FIELDS)


def test_async_trl_rewards_are_awaited_together() -> None:
    """TRL gathers async reward functions (an LLM judge over HTTP): the stage function then
    returns a coroutine, for the controller to await on its loop. The first here waits for
    what the second does, so run one after the other they would never end; one that raises
    is the stage's error, and the others are cancelled (not left running on the loop)."""
    import asyncio

    started = None

    async def waits_for_judge(completions: list, **_: Any) -> list:
        await asyncio.wait_for(started.wait(), timeout=10)  # type: ignore[union-attr]
        return [None for _ in completions]

    async def judge(completions: list, **_: Any) -> list:
        nonlocal started
        started.set()  # type: ignore[union-attr]
        await asyncio.sleep(0)
        return [1.0 for _ in completions]

    cancelled = []

    async def hangs(completions: list, **_: Any) -> list:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return [0.0]

    async def broken(completions: list, **_: Any) -> list:
        await asyncio.sleep(0.01)
        raise ConnectionError("judge server refused")

    def fresh_event(completions: list, **_: Any) -> list:
        nonlocal started
        started = asyncio.Event()  # (made outside the loop: bound to it at its first wait)
        return [0.5]

    fn = trl_reward([fresh_event, waits_for_judge, judge], each=True)
    assert resolved(fn(**FIELDS)) == {"reward": 1.5, "reward_fresh_event": 0.5,
                                      "reward_waits_for_judge": None, "reward_judge": 1.0}
    assert not inspect.isawaitable(trl_reward(fresh_event)(**FIELDS))  # sync: no coroutine
    with pytest.raises(ConnectionError, match="^judge server refused$"):
        resolved(trl_reward([hangs, broken])(**FIELDS))
    assert cancelled == [True]


def test_a_hanging_async_trl_reward_is_a_stage_error_after_its_deadline() -> None:
    """Awaited as the controller awaits an async map stage's call (``user_code.awaited``, on
    the main thread): a call past ``deadline_s`` is the stage's error, and the next call is
    served."""
    import asyncio
    import time

    from pivotflow.controller import user_code
    from pivotflow.controller.sample import Sample
    from pivotflow.errors import StageError
    from pivotflow.graph import Node

    async def judge_server(completions: list, **_: Any) -> list:
        if completions == ["hang"]:
            await asyncio.sleep(60)
        return [1.0]

    fn = trl_reward(judge_server)
    node = Node("reward", "map", "graph.py:7", fn=fn, options={"deadline_s": 0.5})
    sample = Sample(sample_id=3, group_id=1, group_size=1, admit_version=0, seed=0,
                    fields={**FIELDS, "completion": "hang"})

    async def stage(fields: dict[str, Any]) -> Any:
        pending = user_code.call(node, "function", fn, fields, [sample], awaitable=True)
        return await user_code.awaited(node, "function", pending, [sample])

    t = time.monotonic()
    with pytest.raises(StageError, match=r"^map 'reward' at graph.py:7 on sample 3 \(group 1\): "
                                         r"function ran longer than its deadline_s=0.5"):
        asyncio.run(stage(sample.fields))
    assert time.monotonic() - t < 30  # (the hang is 60 s)
    assert asyncio.run(stage(FIELDS)) == 1.0


def test_a_trl_function_logs_through_log_metric() -> None:
    """TRL passes ``log_metric``; here it is the run's (controller/user_metrics.py)."""
    from pivotflow.controller.user_metrics import UserMetrics, recording

    def counted(completions: list, log_metric: Any, **_: Any) -> list:
        log_metric("completions_seen", float(len(completions)))
        return [1.0 for _ in completions]

    metrics = UserMetrics()
    with recording(metrics):
        trl_reward(counted)(**FIELDS)
        trl_reward(counted, group=True)(prompt=["a"] * 3, completion=["1", "2", "3"])
    assert metrics.drain() == {"completions_seen": 2.0}  # (1 + 3) / 2


def test_trl_log_extra_columns_become_the_samples_fields() -> None:
    """TRL's ``log_extra(column, values)`` adds a column to its completions table; here each
    column named in ``extra=`` is a field of the samples the call scored (samples.jsonl's
    ``stage_fields``), None where a call logged none."""
    def parsed(completions: list, log_extra: Any, **_: Any) -> list:
        log_extra("parsed", [c.strip() for c in completions])
        log_extra("digits", [sum(ch.isdigit() for ch in c) for c in completions])
        return [1.0 for _ in completions]

    def quiet(completions: list, **_: Any) -> list:
        return [0.5 for _ in completions]

    fn = trl_reward([parsed, quiet], extra=("parsed", "digits", "unused"))
    assert fn(**{**FIELDS, "completion": " 44"}) == {"reward": 1.5, "parsed": "44",
                                                      "digits": 2, "unused": None}
    grouped = trl_reward([parsed, quiet], group=True, each=True, extra=("digits", "parsed"))
    out = grouped(prompt=["a"] * 3, completion=["1", "x2 ", "3"])
    assert out == {"reward": [1.5] * 3, "reward_parsed": [1.0] * 3, "reward_quiet": [0.5] * 3,
                   "parsed": ["1", "x2", "3"], "digits": [1, 1, 1]}


@pytest.mark.parametrize(("extra", "logs", "error"), [
    ((), ("parsed", ["4"]), r"^log_extra\('parsed'\): not a column this stage keeps; name it "
                            r"in trl_reward\(\.\.\., extra=\('parsed',\)\) and in the stage's "
                            r"writes$"),
    (("parsed",), ("parsed", ["4", "5"]), r"^log_extra\('parsed'\): list \['4', '5'\]; a list "
                                          r"of one value per completion \(1 here\)$"),
    (("parsed",), ("parsed", "4"), r"^log_extra\('parsed'\): str '4'; a list of one value "),
])
def test_a_trl_log_extra_call_it_cannot_keep_is_a_one_line_error(
        extra: tuple, logs: tuple, error: str) -> None:
    def logging(completions: list, log_extra: Any, **_: Any) -> list:
        log_extra(*logs)
        return [1.0]

    with pytest.raises(ValueError, match=error):
        trl_reward(logging, extra=extra)(**FIELDS)


@pytest.mark.parametrize(("extra", "error"), [
    ("parsed", r"^trl_reward: extra='parsed' is one string; give a sequence of column names, "
               r"extra=\('parsed',\)$"),
    (("_x",), r"^trl_reward: extra column '_x' is not a field name"),
    (("a b",), r"^trl_reward: extra column 'a b' is not a field name"),
    (("reward",), r"^trl_reward: extra column 'reward' is named twice \(or is a reward's own "),
    (("p", "p"), r"^trl_reward: extra column 'p' is named twice"),
])
def test_trl_extra_columns_are_checked_when_the_graph_is_built(extra: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        trl_reward(len, extra=extra)


def test_trl_trainer_state_says_the_runs_max_steps() -> None:
    """A curriculum reads ``trainer_state.global_step / trainer_state.max_steps``: max_steps is
    the run's ``steps`` (0 outside a run, TRL's TrainerState default)."""
    from pivotflow.controller.user_metrics import UserMetrics, recording

    seen: list[tuple[int, int]] = []

    def curriculum(completions: list, trainer_state: Any, **_: Any) -> list:
        seen.append((trainer_state.global_step, trainer_state.max_steps))
        return [trainer_state.global_step / max(trainer_state.max_steps, 1)]

    fields = {**FIELDS, "versions": [5, 6]}
    assert trl_reward(curriculum)(**fields) == 5.0
    with recording(UserMetrics(steps=20)):
        assert trl_reward(curriculum)(**fields) == 0.25
    assert seen == [(5, 0), (5, 20)]
