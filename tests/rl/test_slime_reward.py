"""slime's reward functions as stage functions (``rl/slime_reward.py``): ``custom_rm(args,
sample)`` with slime's ``Sample`` attributes (a callable or a ``--custom-rm-path``), its group
form, its remote reward against a real server on loopback, and a real controller's samples."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from script_modules import JsonHandler, http_server

from pivotflow.rl.slime_reward import SlimeSample, slime_reward

FIELDS = {"prompt": "2+2=", "prompt_ids": [5, 6], "response": "4", "response_ids": [9, 2],
          "completion": "4", "answer": "4", "level": 2, "logprobs": [-0.1, -0.2],
          "finish_reason": "stop", "sample_id": 7, "group_id": 3}


def resolved(out: Any) -> Any:
    return asyncio.run(out) if inspect.iscoroutine(out) else out


def test_custom_rm_gets_args_and_slimes_sample() -> None:
    seen: list[tuple[Any, SlimeSample]] = []

    async def custom_rm(args: Any, sample: SlimeSample, **kwargs: Any) -> float:
        await asyncio.sleep(0)
        seen.append((args, sample))
        return float(sample.response.strip() == sample.label) * args.scale

    fn = slime_reward(custom_rm, metadata=("level",), args={"scale": 2.0})
    assert resolved(fn(**FIELDS)) == 2.0
    args, sample = seen[0]
    assert args.scale == 2.0
    assert (sample.index, sample.group_index, sample.prompt, sample.tokens) == (
        7, 3, "2+2=", [5, 6, 9, 2])
    assert (sample.response, sample.response_length, sample.label, sample.metadata) == (
        "4", 2, "4", {"level": 2})
    assert sample.status == "completed" and sample.rollout_log_probs == [-0.1, -0.2]
    truncated = {**FIELDS, "finish_reason": "length"}
    resolved(fn(**truncated))
    assert seen[-1][1].status == "truncated"
    # a plain function is called inline, no coroutine
    assert slime_reward(lambda args, sample: 1)(**FIELDS) == 1.0


def test_a_dict_reward_needs_slimes_reward_key() -> None:
    def rm(args: Any, sample: SlimeSample) -> dict[str, Any]:
        return {"score": 0.5, "acc": True}

    assert slime_reward(rm, reward_key="score")(**FIELDS) == 0.5
    assert slime_reward(rm, reward_key="acc")(**FIELDS) == 1.0
    for kw, error in [({}, r"^slime reward rm returned a dict \(keys \['acc', 'score'\]\): "
                           r"name the reward's key with reward_key="),
                      ({"reward_key": "pred"}, r"^slime reward rm returned no 'pred'")]:
        with pytest.raises(ValueError, match=error):
            slime_reward(rm, **kw)(**FIELDS)
    with pytest.raises(ValueError, match=r"^slime reward <lambda> returned str '1', not a number"):
        slime_reward(lambda args, sample: "1")(**FIELDS)
    with pytest.raises(ValueError, match=r"^slime reward: no field 'label' to pass as the label"):
        slime_reward(rm, label="label", reward_key="score")(**FIELDS)


def test_group_rm_gets_the_groups_samples_once() -> None:
    calls: list[list[SlimeSample]] = []

    async def group_rm(args: Any, samples: list[SlimeSample]) -> list[float]:
        calls.append(samples)
        return [float(s.response == s.label) for s in samples]

    group = {k: [v, v, v] for k, v in FIELDS.items()}
    group["response"] = ["4", "5", "4"]
    group["sample_id"] = [0, 1, 2]
    assert resolved(slime_reward(group_rm, group=True)(**group)) == {"reward": [1.0, 0.0, 1.0]}
    assert len(calls) == 1 and [s.index for s in calls[0]] == [0, 1, 2]
    with pytest.raises(ValueError, match=r"^slime group reward <lambda> returned list \[1\]: a "
                                         r"list of one reward per sample \(3 here\)$"):
        slime_reward(lambda args, samples: [1], group=True)(**group)


def test_a_custom_rm_path_is_imported_as_slime_imports_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_rm.py").write_text("async def reward_func(args, sample, **kwargs):\n"
                                       "    return {'score': len(sample.response)}\n")
    (tmp_path / "broken_rm.py").write_text("import no_such_module_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = slime_reward("my_rm.reward_func", reward_key="score")
    assert resolved(fn(**FIELDS)) == 1.0
    for path, error in [("my_rm.nothing", r"'my_rm.nothing' names no function"),
                        ("broken_rm.f", r"importing 'broken_rm' for 'broken_rm.f' raised "
                                        r"ModuleNotFoundError: No module named "
                                        r"'no_such_module_here'$"),
                        ("", r"'' is neither a function, a module.function path nor a URL")]:
        with pytest.raises(ValueError, match=error):
            slime_reward(path)


class _SlimeRM(JsonHandler):
    """slime's remote_rm protocol: {"prompt", "response", "label"} -> a reward (JSON)."""

    def answer(self, body: Any) -> tuple[int, str, dict[str, str]]:
        self.server.seen.append(body)  # type: ignore[attr-defined]
        return 200, json.dumps(float(body["response"].strip() == body["label"])), {}


@pytest.fixture
def slime_server() -> Iterator[Any]:
    with http_server(_SlimeRM, "/") as srv:
        srv.seen = []
        yield srv


def test_slimes_remote_rm_posts_prompt_response_and_label(slime_server: Any) -> None:
    fn = slime_reward(slime_server.url)
    assert resolved(fn(**FIELDS)) == 1.0
    assert resolved(fn(**{**FIELDS, "response": "5"})) == 0.0
    assert slime_server.seen[0] == {"prompt": "2+2=", "response": "4", "label": "4"}
    group = {k: [v, v] for k, v in FIELDS.items()}
    with pytest.raises(ValueError, match="scores one sample a call: group=False"):
        resolved(slime_reward(slime_server.url, group=True)(**group))

