"""ToolPool on good calls: results, output cap, printed output, async use, start and close."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pivotflow.errors import ConfigError, ToolError
from pivotflow.tools import Tool, ToolCall, ToolPool, ToolRegistry, tool
from pivotflow.tools.builtin import calculator

pytestmark = pytest.mark.timeout(60)


def _registry() -> ToolRegistry:
    registry = ToolRegistry([calculator])
    registry.load("pool_sample_tools:echo")
    registry.load("pool_sample_tools:printer")
    registry.load("pool_sample_tools:sleeper")
    registry.load("pool_sample_tools:span")
    registry.load("pool_sample_tools:Counter")
    return registry


def test_results_truncation_and_print() -> None:
    with ToolPool(_registry(), workers=1, timeout_s=2.0, max_output_chars=10) as pool:
        assert pool.call(ToolCall("calculator", {"expression": "(12 + 7) * 31"})).content == "589"
        cut = pool.call(ToolCall("echo", {"text": "ab", "times": 20}))
        assert cut.ok and cut.kind == "truncated"
        assert cut.content == "ababababab\n[output truncated: 40 characters, cap 10]"
        assert pool.call(ToolCall("printer", {"text": "hi"})).content == "hi\n"
        # a class tool keeps its state inside its worker process
        assert [pool.call(ToolCall("counter", {"step": 2})).content for _ in range(2)] == ["2", "4"]
        assert pool.counters == {"ok": 4, "truncated": 1}
        assert pool.restarts == 0


async def test_acall_runs_concurrently_without_blocking_the_loop() -> None:
    pool = ToolPool(_registry(), workers=2, timeout_s=5.0)
    try:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        results = await pool.acall_all([ToolCall("span", {"seconds": 0.4})] * 2)
        task.cancel()
        assert all(r.ok for r in results), results
        (a0, a1), (b0, b1) = ([float(t) for t in r.content.split()] for r in results)
        # each call says when it slept: on two workers the two sleeps overlap (however busy
        # the machine, which a wall-time bound on the pair could not tell apart)
        assert max(a0, b0) < min(a1, b1), "two calls on two workers should overlap"
        # the loop ran meanwhile: it ticked every 10 ms while the tools slept
        assert ticks >= 10, "the event loop was blocked while tools ran"
    finally:
        await pool.aclose()
    with pytest.raises(ToolError, match="acall after close"):
        await pool.acall(ToolCall("calculator", {"expression": "1"}))


def test_close_reaps_every_worker() -> None:
    pool = ToolPool(_registry(), workers=2, timeout_s=1.0)
    pids = pool.pids()
    assert len(pids) == 2
    pool.call(ToolCall("sleeper", {"seconds": 5}))  # a timeout: one worker replaced
    pids += pool.pids()
    pool.close()
    pool.close()
    assert pool.pids() == []
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    with pytest.raises(ToolError, match="after close"):
        pool.call(ToolCall("calculator", {"expression": "1"}))


def test_tools_must_be_importable_by_path() -> None:
    @tool
    def local(x: int) -> int:
        return x

    with pytest.raises(ToolError, match="'local' cannot run in the tool pool"):
        ToolPool(ToolRegistry([local]), workers=1)


def test_worker_that_cannot_import_its_tool_fails_the_start() -> None:
    ghost = Tool(
        "ghost",
        "",
        {"type": "object", "properties": {}},
        lambda: 0,
        "no_such_module_for_pivotflow_tests:ghost",
    )
    with pytest.raises(ToolError, match="tool worker failed to start: .*no_such_module"):
        ToolPool(ToolRegistry([ghost]), workers=1, start_timeout_s=20)


def test_bad_limits_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="timeout_s must be > 0"):
        ToolPool(_registry(), timeout_s=0)
