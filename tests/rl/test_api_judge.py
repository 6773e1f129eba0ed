"""A judge behind an OpenAI-compatible API (``rl/api_judge.py``) against a real one:
``examples/openai_server.py`` serving a random-weight model folder with the embedded engine on
loopback. The verdict is what the same engine generates greedily for the same prompt, a chat
template renders messages, and every failure is one line."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from script_modules import load_script, nothing_listens

from pivotflow.engines.base import SamplingParams
from pivotflow.graph import fn_reads
from pivotflow.rl import http_calls
from pivotflow.rl.api_judge import openai_judge

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(random_models: dict[str, Path]) -> Iterator[Any]:
    mod: ModuleType = load_script(ROOT / "examples" / "openai_server.py")
    srv = mod.serve_in_thread(random_models["judge"], name="judge")
    yield srv
    srv.shutdown()
    srv.server_close()


def template(prompt: str, response: str, **_: Any) -> str:
    return f"{prompt}{response}?"


def chat_template(prompt: str, response: str, **_: Any) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Is {prompt}{response} right?"}]


def first_char(verdict: str, **_: Any) -> float | None:
    """Any verdict with a first character 'reads' (a random model's text): 1.0 or 0.0 by its
    parity, None for an empty one."""
    return float(ord(verdict[0]) % 2) if verdict else None


def greedy(srv: Any, prompt_ids: list[int], max_tokens: int) -> str:
    """What the server's own engine generates for ``prompt_ids``, asked directly."""
    engine = srv.engine
    out = engine.generate(prompt_ids, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    return str(engine.tok.decode([t for t in out.token_ids if t not in engine.tok.eos_ids]))


FIELDS = {"prompt": "2+2=", "response": "4", "answer": "4"}


def judged(fn: Callable[..., Any], **fields: Any) -> Any:
    return asyncio.run(fn(**{**FIELDS, **fields}))


def test_a_string_template_is_completed_greedily_as_the_engine_would(server: Any) -> None:
    fn = openai_judge(server.url(), "judge", template, first_char, max_tokens=6)
    got = judged(fn)
    tok = server.engine.tok
    want = greedy(server, tok.encode("2+2=4?", add_special_tokens=True), 6)
    assert got["verdict"] == want
    assert got["reward"] == first_char(want) and got["judge_failed"] is (want == "")
    assert fn_reads(fn, "here", "genrm") == {"prompt", "response"}  # the template's reads


def test_chat_messages_go_through_the_models_chat_template(server: Any) -> None:
    fn = openai_judge(server.url(), "judge", chat_template, first_char, max_tokens=5)
    tok = server.engine.tok
    rendered = tok.apply_chat_template(chat_template(**FIELDS), add_generation_prompt=True)
    assert judged(fn)["verdict"] == greedy(server, tok.encode(rendered), 5)


def test_a_verdict_parse_cannot_read_is_a_failed_judgement(server: Any) -> None:
    fn = openai_judge(server.url(), "judge", template, lambda verdict, **_: None)
    out = judged(fn)
    assert out["reward"] is None and out["judge_failed"] is True


@pytest.mark.parametrize(("kw", "error"), [
    ({"parse": lambda verdict, **_: "1.0"}, r"^parse returned a str 1.0, expected a number "
                                            r"or None$"),
    ({"template": lambda **_: [1, 2]}, r"^template returned list, expected a str or a list "
                                       r"of chat messages"),
    ({"max_tokens": 10_000}, r"^judge 'judge' failed after 1 tries; last: http://127.0.0.1:\d+"
                             r"/v1/completions answered 400: .*over the model's context"),
])
def test_what_a_judge_cannot_use_is_a_one_line_error(server: Any, kw: dict[str, Any],
                                                      error: str) -> None:
    args = {"template": template, "parse": first_char, **kw}
    fn = openai_judge(server.url(), "judge", args.pop("template"), args.pop("parse"), **args)
    with pytest.raises((ValueError, ConnectionError), match=error) as info:
        judged(fn)
    assert "\n" not in str(info.value)


def test_a_judge_that_is_down_fails_after_its_tries_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_calls, "RETRY_WAIT_S", 0.01)
    url = nothing_listens("/v1")
    fn = openai_judge(url, "judge", template, first_char, retries=2)
    with pytest.raises(ConnectionError, match=rf"^judge 'judge' failed after 2 tries; last: "
                                              rf"{url}/completions: ClientConnectorError "):
        judged(fn)
    with pytest.raises(ValueError, match=r"^judge 'judge': localhost:8000/v1 is not an "
                                         r"http\(s\):// URL$"):
        openai_judge("localhost:8000/v1", "judge", template, first_char)
