"""Every kind of bad tool call becomes an error observation and a counter; the pool survives."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pivotflow.tools import HermesParser, ToolCall, ToolPool, ToolRegistry
from pivotflow.tools.builtin import calculator

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pool() -> Iterator[ToolPool]:
    registry = ToolRegistry([calculator])
    registry.load("pool_sample_tools")
    with ToolPool(
        registry,
        workers=2,
        timeout_s=2.0,
        cpu_s=0.25,
        memory_mb=64,
        max_output_chars=200,
        max_argument_chars=1000,
    ) as p:
        yield p


def _bad(pool: ToolPool, call: ToolCall | object, kind: str, text: str) -> None:
    """The call gives `kind` with `text` in its observation, counts once, and a good call
    still works afterwards."""
    before = pool.counters[kind]
    result = pool.call(call)  # type: ignore[arg-type]
    assert result.kind == kind, result
    assert result.error is not None and not result.ok
    assert result.content.startswith("Error: ")
    assert text in result.content, result.content
    assert pool.counters[kind] == before + 1
    for _ in range(3):  # more calls than workers: every worker, replaced or not, still serves
        good = pool.call(ToolCall("calculator", {"expression": "6 * 7"}))
        assert (good.kind, good.content) == ("ok", "42")


def test_malformed_json(pool: ToolPool) -> None:
    parsed = HermesParser().parse('<tool_call>{"name": "calculator", "arguments": {</tool_call>')
    _bad(pool, parsed, "parse", "malformed tool call JSON at char 0")


def test_unknown_tool(pool: ToolPool) -> None:
    _bad(
        pool,
        ToolCall("nope", {}),
        "unknown_tool",
        "unknown tool 'nope'; available tools: calculator, echo",
    )


def test_wrong_argument_types(pool: ToolPool) -> None:
    _bad(
        pool,
        ToolCall("calculator", {"expression": 12}),
        "arguments",
        "tool 'calculator': argument 'expression' must be string, got int 12",
    )
    _bad(
        pool,
        ToolCall("echo", {"text": "a", "times": "3"}),
        "arguments",
        "argument 'times' must be integer, got str '3'",
    )
    _bad(pool, ToolCall("calculator", {}), "arguments", "missing required argument(s): expression")
    _bad(
        pool,
        ToolCall("calculator", {"expression": "1", "x": 1}),
        "arguments",
        "unknown argument 'x'",
    )


def test_huge_arguments(pool: ToolPool) -> None:
    _bad(
        pool,
        ToolCall("echo", {"text": "x" * 50_000}),
        "too_large",
        "arguments are 50012 characters; the cap is 1000",
    )


def test_tool_raises(pool: ToolPool) -> None:
    _bad(
        pool,
        ToolCall("boom", {"message": "kaput"}),
        "error",
        "tool 'boom' raised RuntimeError: kaput",
    )
    _bad(pool, ToolCall("calculator", {"expression": "1/0"}), "error", "ZeroDivisionError")


def test_hang(pool: ToolPool) -> None:
    _bad(
        pool,
        ToolCall("sleeper", {"seconds": 60}),
        "timeout",
        "tool 'sleeper' timed out after 2 s and was killed",
    )


def test_cpu_loop(pool: ToolPool) -> None:
    _bad(pool, ToolCall("spin", {}), "cpu", "exceeded its CPU-time limit of 0.25 s")


def test_fork_bomb(pool: ToolPool) -> None:
    _bad(
        pool,
        ToolCall("fork_bomb", {"forks": 200}),
        "fork",
        "tried os.fork, which the tool sandbox forbids",
    )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# a fork through libc (past the audit hook), setsid survivors and fork bombs: in
# tests/security/test_tool_sandbox.py, which watches the host's processes


def test_unbounded_allocation(pool: ToolPool) -> None:
    _bad(pool, ToolCall("hog", {}), "memory", "tool 'hog' ran out of memory (limit: 64 MB")


def test_socket(pool: ToolPool) -> None:
    _bad(
        pool,
        ToolCall("connect", {}),
        "network",
        "tried socket.__new__, which the tool sandbox forbids (tools have no network access)",
    )


def test_network_namespace_has_only_loopback(pool: ToolPool) -> None:
    if not pool.isolation.get("net_namespace"):
        pytest.skip("this kernel does not let the worker make a network namespace")
    assert pool.call(ToolCall("interfaces", {})).content == '["lo"]'


def test_crashes(pool: ToolPool) -> None:
    _bad(
        pool,
        ToolCall("crash", {"how": "exit"}),
        "crash",
        "tool 'crash' crashed: its worker process exited with status 7",
    )
    _bad(pool, ToolCall("crash", {"how": "segv"}), "crash", "killed by SIGSEGV")


def test_output_flood(pool: ToolPool) -> None:
    _bad(pool, ToolCall("flood", {}), "output", "wrote a reply over 5296 bytes and was killed")


def test_restarts_are_counted_and_workers_stay_bounded(pool: ToolPool) -> None:
    before = pool.restarts
    pool.call(ToolCall("crash", {"how": "exit"}))
    assert pool.restarts == before + 1
    assert len(pool.pids()) == 2
    assert all(_alive(pid) for pid in pool.pids())
    assert os.getpid() not in pool.pids()
