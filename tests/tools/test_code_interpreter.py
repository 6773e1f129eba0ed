"""The code interpreter tool (``tools/code_interpreter.py``): the policy's Python runs in the code
sandbox through the ``ToolPool``, locally or on sandbox servers of both protocols; what the
policy reads back for a program that prints, raises, hangs, runs out of memory, prints too much
or reaches for the network; a call with bad arguments; a pool that also runs worker tools."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from script_modules import sandbox_server

from pivotflow.errors import GraphError
from pivotflow.graph import Graph
from pivotflow.tools import ToolCall, ToolPool, ToolRegistry
from pivotflow.tools.builtin import calculator
from pivotflow.tools.code_interpreter import code_interpreter

pytestmark = pytest.mark.timeout(120)

PROGRAMS = {
    "prints": "print(sum(range(101)))",
    "raises": "def f():\n    return 1 / 0\nprint('before')\nf()\n",
    "hangs": "import time\nprint('started', flush=True)\ntime.sleep(30)\n",
    "quiet": "x = 6 * 7",
    "fresh": "print(x)",  # (x of the call before is not there: each call a new interpreter)
    "network": "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\n",
}


def calls(pool: ToolPool, names: list[str]) -> dict[str, tuple[str, str]]:
    async def run() -> list:
        return await pool.acall_all([ToolCall("code_interpreter", {"code": PROGRAMS[n]})
                                     for n in names])
    return {n: (r.kind, r.content) for n, r in zip(names, asyncio.run(run()), strict=True)}


def check_observations(got: dict[str, tuple[str, str]]) -> None:
    assert got["prints"] == ("ok", "5050\n")
    kind, text = got["raises"]
    # what the interpreter prints, from the program's own frames on, named solution.py
    assert kind == "error" and text.startswith("before\nTraceback (most recent call last):")
    assert 'File "solution.py", line 4, in <module>' in text and "case_forker" not in text
    assert text.endswith("ZeroDivisionError: division by zero")
    assert got["hangs"] == ("timeout", "started\nError: the program ran past 2 s and was killed")
    assert got["quiet"] == ("ok", "(no output: print what you want to see)")
    assert got["fresh"][0] == "error"
    assert got["fresh"][1].endswith("NameError: name 'x' is not defined")
    assert got["network"][0] == "error" and "OSError" in got["network"][1]


def test_programs_run_in_the_code_sandbox_and_the_policy_reads_what_they_did() -> None:
    registry = ToolRegistry([code_interpreter, calculator])
    with ToolPool(registry, workers=2, timeout_s=2.0, memory_mb=256,
                  max_output_chars=200) as pool:
        check_observations(calls(pool, list(PROGRAMS)))
        big = pool.call(ToolCall("code_interpreter", {"code": "print('x' * 1000)"}))
        assert big.kind == "truncated" and big.ok
        assert big.content.endswith("[output truncated: 1001 characters, cap 200]")
        memory = pool.call(ToolCall("code_interpreter", {"code": "b = bytearray(2**30)"}))
        assert memory.kind == "memory" and memory.content.endswith("MemoryError")
        bad = pool.call(ToolCall("code_interpreter", {"source": "print(1)"}))
        assert bad.kind == "arguments" and "missing required argument(s): code" in bad.content
        # the worker tool beside it runs in its tool worker as before
        assert pool.call(ToolCall("calculator", {"expression": "6*7"})).content == "42"
        assert pool.counters == {"ok": 3, "error": 3, "timeout": 1, "truncated": 1,
                                 "memory": 1, "arguments": 1}


def test_a_pool_of_the_code_interpreter_alone_starts_no_tool_worker() -> None:
    with ToolPool(ToolRegistry([code_interpreter]), workers=2, timeout_s=2.0) as pool:
        assert pool.pids() == []
        assert pool.call(ToolCall("code_interpreter", {"code": "print(1)"})).content == "1\n"


@pytest.fixture(params=["pivotflow", "sandboxfusion"])
def server_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with sandbox_server(tmp_path / "cache", "--protocol", request.param) as (url, _):
        yield url


def test_on_a_sandbox_server_the_policy_reads_the_same(server_url: str) -> None:
    with ToolPool(ToolRegistry([code_interpreter]), workers=2, timeout_s=2.0,
                  sandbox_url=server_url) as pool:
        check_observations(calls(pool, list(PROGRAMS)))


def test_an_unreachable_server_is_an_observation_and_a_bad_option_names_the_line() -> None:
    with ToolPool(ToolRegistry([code_interpreter]), workers=1, timeout_s=2.0,
                  sandbox_url="http://127.0.0.1:9") as pool:
        result = pool.call(ToolCall("code_interpreter", {"code": "print(1)"}))
    assert result.kind == "crash" and result.content.startswith("Error: the sandbox failed:")
    assert result.error is not None and "127.0.0.1:9" in result.error
    g = Graph("g")
    with pytest.raises(GraphError, match="unknown tool_pool options \\['sandbox'\\]"):
        g.generate("rollout", model="policy", pool="rollout",
                   tools="pivotflow.tools.code_interpreter:code_interpreter",
                   tool_pool={"sandbox": "http://x"})
