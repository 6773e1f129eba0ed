"""What a code interpreter call costs: calls a second and their latency through the tool pool, the
policy's program in the code sandbox (``tools/code_interpreter.py``), beside the calculator
in a tool worker through the same pool, in one sitting.

Each call is what a tool-integrated reasoner sends (``print`` of a small computation);
``--calls`` of them, ``--workers`` at a time (the pool's width, so a latency is a call's own
time, not a wait in the pool's queue). Variants,
alternated ``--repeats`` times: ``code`` (a bubblewrap sandbox and a forked interpreter a call)
and ``calculator`` (an AST walk in a long-lived sandboxed worker: the pool's own cost, the
bound on any tool's rate through it). The last line printed is one JSON object.

    python bench/code_interpreter.py [--calls 200] [--workers 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import statistics
import time
from typing import Any

from pivotflow.tools import ToolCall, ToolPool, ToolRegistry
from pivotflow.tools.builtin import calculator
from pivotflow.tools.code_interpreter import code_interpreter


def calls_of(kind: str, n: int) -> list[ToolCall]:
    if kind == "code":
        return [ToolCall("code_interpreter", {"code": f"a, b = {i}, {i + 7}\nprint(a * b + 1)"})
                for i in range(n)]
    return [ToolCall("calculator", {"expression": f"{i} * {i + 7} + 1"}) for i in range(n)]


def timed(pool: ToolPool, kind: str, n: int, workers: int) -> dict[str, Any]:
    """``n`` calls, ``workers`` at a time (the pool's own width: no call waits in its queue):
    calls a second, and each call's latency (ms)."""
    async def run() -> tuple[float, list[float]]:
        turns = asyncio.Semaphore(workers)

        async def one(call: ToolCall) -> float:
            async with turns:
                start = time.perf_counter()
                result = await pool.acall(call)
                assert result.ok, result.content
                return (time.perf_counter() - start) * 1000

        start = time.perf_counter()
        latencies = await asyncio.gather(*(one(c) for c in calls_of(kind, n)))
        return time.perf_counter() - start, list(latencies)

    seconds, latencies = asyncio.run(run())
    latencies.sort()
    return {"calls_per_s": round(n / seconds, 1),
            "p50_ms": round(latencies[len(latencies) // 2], 2),
            "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1], 2)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {"code": [], "calculator": []}
    with ToolPool(ToolRegistry([code_interpreter, calculator]), workers=args.workers,
                  timeout_s=10.0, memory_mb=512) as pool:
        timed(pool, "code", args.workers, args.workers)  # (warm: the first sandbox, the
        timed(pool, "calculator", args.workers, args.workers)  # worker's imports)
        for r in range(args.repeats):
            for kind in (["code", "calculator"] if r % 2 == 0 else ["calculator", "code"]):
                runs[kind].append(timed(pool, kind, args.calls, args.workers))

    def median(kind: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[kind])

    out = {"bench": "code_interpreter",
           "when": datetime.datetime.now().isoformat(timespec="seconds"),
           "calls": args.calls, "workers": args.workers, "runs": runs,
           "code_calls_per_s": median("code", "calls_per_s"),
           "code_p50_ms": median("code", "p50_ms"), "code_p99_ms": median("code", "p99_ms"),
           "calculator_calls_per_s": median("calculator", "calls_per_s"),
           "code_over_calculator": round(median("code", "calls_per_s")
                                         / median("calculator", "calls_per_s"), 4)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
