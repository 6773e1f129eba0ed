"""OpenRLHF's reward functions and reward servers as stage functions (``rl/openrlhf_reward.py``):
a ``reward_func(queries, prompts, labels)`` (a callable or a .py file, sync or async) and real
HTTP servers on loopback speaking OpenRLHF's protocol (examples/reward_server.py, and a few
that misbehave), their returns read as OpenRLHF reads them, every failure one line."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from script_modules import JsonHandler, http_server, load_script, nothing_listens

from pivotflow.controller.user_metrics import UserMetrics, recording
from pivotflow.graph import fn_reads
from pivotflow.rl import http_calls
from pivotflow.rl.openrlhf_reward import openrlhf_reward

ROOT = Path(__file__).resolve().parents[2]
reward_server = load_script(ROOT / "examples" / "reward_server.py")

SAMPLE = {"prompt_text": "<bos>2+2=", "sequence_text": "<bos>2+2=4<eos>", "answer": "4",
          "completion": "4", "level": 2}


def resolved(out: Any) -> Any:
    return asyncio.run(out) if inspect.iscoroutine(out) else out


def test_a_reward_func_gets_queries_prompts_and_labels_and_its_dict_is_read() -> None:
    seen: list[tuple[Any, ...]] = []

    def reward_func(queries: list[str], prompts: list[str], labels: list[str],
                    **kwargs: Any) -> dict[str, Any]:
        seen.append((queries, prompts, labels))
        r = torch.tensor([1.0 if q.startswith(p) else 0.0 for q, p in zip(queries, prompts, strict=True)])
        return {"rewards": r, "scores": r * 0.5, "extra_logs": {"accuracy": r.mean(),
                                                                  "chars": torch.tensor([3])}}

    metrics = UserMetrics()
    with recording(metrics):
        assert openrlhf_reward(reward_func)(**SAMPLE) == 1.0
        assert openrlhf_reward(reward_func, scores=True)(**SAMPLE) == {"reward": 1.0,
                                                                        "score": 0.5}
    assert seen[0] == (["<bos>2+2=4<eos>"], ["<bos>2+2="], ["4"])
    assert metrics.drain() == {"accuracy": 1.0, "chars": 3.0}  # as OpenRLHF logs extra_logs
    fn = openrlhf_reward(reward_func, label="level")
    assert fn_reads(fn, "here", "reward") == {"prompt_text", "sequence_text"}
    with recording(UserMetrics()):
        fn(**SAMPLE)
    assert seen[-1][2] == [2]


def test_a_group_call_and_the_return_forms_openrlhf_accepts() -> None:
    def bare(queries: list[str], prompts: list[str], labels: list[Any]) -> torch.Tensor:
        return torch.tensor([float(q.endswith(f"{a}<eos>")) for q, a in zip(queries, labels,
                                                                            strict=True)])

    group = {"prompt_text": ["1+1="] * 3, "sequence_text": ["1+1=2<eos>", "1+1=3<eos>",
                                                            "1+1=2<eos>"],
             "answer": ["2"] * 3}
    assert openrlhf_reward(bare, group=True)(**group) == {"reward": [1.0, 0.0, 1.0]}
    assert openrlhf_reward(bare, group=True, scores=True)(**group)["score"] == [1.0, 0.0, 1.0]

    async def judged(queries: list[str], prompts: list[str], labels: list[Any]) -> list[float]:
        await asyncio.sleep(0)
        return [0.25] * len(queries)

    out = openrlhf_reward(judged, label=None)(prompt_text="p", sequence_text="pq")
    assert inspect.iscoroutine(out) and asyncio.run(out) == 0.25  # awaited by the controller


@pytest.mark.parametrize(("returned", "error"), [
    ([1.0, 2.0], r"^OpenRLHF reward f returned rewards \[1.0, 2.0\]: one number per query "
                 r"\(1 here\)$"),
    ({"reward": [1.0]}, r"^OpenRLHF reward f returned a dict without 'rewards' \(keys "
                        r"\['reward'\]\)$"),
    ({"rewards": [float("nan")]}, r"^OpenRLHF reward f returned rewards holding nan, not a "
                                  r"finite number$"),
    ({"rewards": [1.0], "extra_logs": [1]}, r"^OpenRLHF reward f returned extra_logs of type "
                                            r"list, expected a dict$"),
    ({"rewards": ["1"]}, r"^OpenRLHF reward f returned rewards holding '1', not a finite "),
])
def test_a_return_openrlhf_would_not_read_is_a_one_line_error(returned: Any,
                                                              error: str) -> None:
    def f(queries: list[str], prompts: list[str], labels: list[Any]) -> Any:
        return returned

    with recording(UserMetrics()), pytest.raises(ValueError, match=error):
        openrlhf_reward(f)(**SAMPLE)


def test_a_reward_func_file_is_loaded_as_openrlhf_loads_it(tmp_path: Path) -> None:
    good = tmp_path / "reward_func.py"
    good.write_text("def reward_func(queries, prompts, labels, **kwargs):\n"
                    "    return {'rewards': [float(len(q) > len(p)) for q, p in "
                    "zip(queries, prompts)]}\n")
    assert openrlhf_reward(str(good))(**SAMPLE) == 1.0
    (tmp_path / "none.py").write_text("def score(q):\n    return 1\n")
    (tmp_path / "broken.py").write_text("import not_a_module_anywhere\n" + "x = 1\n" * 500)
    for path, error in [
        (tmp_path / "missing.py", r"missing.py: no such file$"),
        (tmp_path / "none.py", r"none.py defines no reward_func\(queries, prompts, labels\)$"),
        (tmp_path / "broken.py", r"broken.py raised ModuleNotFoundError on import: No module "
                                 r"named 'not_a_module_anywhere'$"),
    ]:
        with pytest.raises(ValueError, match=error) as info:
            openrlhf_reward(str(path))
        assert "\n" not in str(info.value) and "x = 1" not in str(info.value)
    for bad, error in [("reward.txt", r"reward: reward.txt is neither a .py file nor an http"),
                       ([], r"\[\] is neither a function, a .py file nor a reward server"),
                       ("http://127.0.0.1:1/r", None)]:
        if error is None:  # a URL is checked when called, not when the graph is built
            openrlhf_reward(bad)
            continue
        with pytest.raises(ValueError, match=error):
            openrlhf_reward(bad)
    with pytest.raises(ValueError, match="no field 'answer' to pass as labels"):
        openrlhf_reward(lambda q, p, labels: [1.0])(prompt_text="p", sequence_text="pq")


@pytest.fixture
def servers() -> Iterator[list[Any]]:
    started = [reward_server.serve_in_thread(), reward_server.serve_in_thread()]
    yield started
    for s in started:
        s.shutdown()
        s.server_close()


def test_a_reward_server_is_called_in_turn_and_its_answer_read(servers: list[Any]) -> None:
    fn = openrlhf_reward([s.url() for s in servers], scores=True)
    metrics = UserMetrics()

    async def four() -> list[Any]:
        return [await fn(**{**SAMPLE, "sequence_text": f"<bos>2+2={r}<eos>"})
                for r in ("4", "5", "4", "44")]

    with recording(metrics):
        got = asyncio.run(four())
    assert got == [{"reward": 1.0, "score": 1.0}, {"reward": 0.0, "score": 0.0},
                   {"reward": 1.0, "score": 1.0}, {"reward": 0.0, "score": 0.0}]
    assert [s.requests for s in servers] == [2, 2]  # in turn
    assert servers[0].seen[0] == {"query": ["<bos>2+2=4<eos>"], "prompts": ["<bos>2+2="],
                                  "labels": ["4"]}
    assert metrics.drain() == {"response_chars": 1.25}  # its extra_logs, averaged


class _Scripted(JsonHandler):
    """Answers with the server's next scripted (status, body[, Retry-After]), then 200s."""

    def answer(self, body: Any) -> tuple[int, str, dict[str, str]]:
        srv: Any = self.server
        srv.hits += 1
        status, text, *after = (srv.script.pop(0) if srv.script
                                else (200, json.dumps({"rewards": [0.5]})))
        return status, text, {"Retry-After": after[0]} if after else {}


@pytest.fixture
def scripted() -> Iterator[Any]:
    with http_server(_Scripted, "/get_reward") as srv:
        srv.hits, srv.script = 0, []
        yield srv


def call(fn: Any) -> Any:
    with recording(UserMetrics()):
        return asyncio.run(fn(**SAMPLE))


def test_a_server_error_is_retried_a_bad_request_is_not(scripted: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_calls, "RETRY_WAIT_S", 0.01)
    scripted.script = [(503, "overloaded"), (502, "bad gateway")]
    assert call(openrlhf_reward(scripted.url)) == 0.5 and scripted.hits == 3
    scripted.hits, scripted.script = 0, [(400, "missing 'query'\n" + "detail " * 200)]
    with pytest.raises(ConnectionError) as info:
        call(openrlhf_reward(scripted.url))
    assert scripted.hits == 1  # not retried
    msg = str(info.value)
    assert msg.startswith("reward server failed after 1 tries; last: http://127.0.0.1:")
    assert "answered 400: missing 'query' detail" in msg and "\n" not in msg and len(msg) < 300
    scripted.hits, scripted.script = 0, [(200, "<html>not json</html>")]
    with pytest.raises(ValueError, match=r"answered 200 with no JSON: <html>not json</html>$"):
        call(openrlhf_reward(scripted.url))


def test_a_server_that_is_down_fails_after_its_tries_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_calls, "RETRY_WAIT_S", 0.01)
    url = nothing_listens("/get_reward")
    with pytest.raises(ConnectionError, match=rf"^reward server failed after 3 tries; last: "
                                              rf"{url}: ClientConnectorError Cannot connect to host "):
        call(openrlhf_reward(url, retries=3))
    with pytest.raises(ValueError, match="^reward server: retries must be a whole number >= 1, "
                                         "got 0$"):
        openrlhf_reward(url, retries=0)


def test_a_rate_limit_waits_what_it_asks_else_the_wait_doubles(
        scripted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """429 and 408 are tried again (a 4xx otherwise is not); the waits between tries are a
    Retry-After where the server sends one, else 1, 2, 4 ... s, at most MAX_WAIT_S (recorded
    here instead of slept)."""
    waits: list[float] = []

    async def no_sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(http_calls, "_sleep", no_sleep)
    scripted.script = [(429, "slow down", "0.25"), (429, "slow down", "600"), (408, "late"),
                       (503, "busy"), (429, "slow down", "Wed, 21 Oct 2026 07:28:00 GMT")]
    assert call(openrlhf_reward(scripted.url, retries=6)) == 0.5
    assert scripted.hits == 6
    assert waits == [0.25, 30.0, 4.0, 8.0, 16.0]  # asked; capped; doubling; an HTTP-date: none
