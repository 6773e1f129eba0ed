"""Tool pool throughput and latency: calculator calls through sandboxed worker processes.

Run: python bench/tool_pool.py [--calls 2000] [--workers 2] [--isolation bwrap|none]

Measured in one run, so ratios compare like with like:
  direct     the calculator called in this process (no pool): the floor;
  sync       ``ToolPool.call`` one after another from one thread (per-call latency);
  async      ``ToolPool.acall`` from an asyncio loop with ``--concurrency`` calls in flight;
  crash      a call whose worker dies (os._exit): kill + replace + the next call's start wait,
             i.e. what one failing call costs the pool (with bwrap: a new sandbox, too).
``--isolation none`` runs the workers without bubblewrap, to price the OS isolation.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from pivotflow.tools import ToolCall, ToolPool, ToolRegistry, tool
from pivotflow.tools.builtin import calculator, evaluate


@tool
def die(code: int) -> str:
    """Exit the worker process at once (to time a worker replacement)."""
    import os

    os._exit(code)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _calls(n: int) -> list[ToolCall]:
    return [ToolCall("calculator", {"expression": f"({i} + 7) * 31 - {i} // 3"}) for i in range(n)]


async def _async_run(pool: ToolPool, calls: list[ToolCall], concurrency: int) -> list[float]:
    sem = asyncio.Semaphore(concurrency)
    lat: list[float] = []

    async def one(c: ToolCall) -> None:
        async with sem:
            t = time.perf_counter()
            r = await pool.acall(c)
            lat.append(time.perf_counter() - t)
            if not r.ok:
                raise SystemExit(f"bench call failed: {r.content}")

    await asyncio.gather(*(one(c) for c in calls))
    return lat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--crashes", type=int, default=20)
    ap.add_argument("--isolation", default="bwrap", choices=["bwrap", "none"])
    args = ap.parse_args()
    calls = _calls(args.calls)

    t0 = time.perf_counter()
    for c in calls:
        evaluate(c.arguments["expression"])
    direct_s = time.perf_counter() - t0

    # worker processes import tools by module path, and "__main__:die" is not one: take `die`
    # from this file imported under its own name (its folder is on sys.path when run)
    from tool_pool import die as importable_die

    registry = ToolRegistry([calculator, importable_die])
    t0 = time.perf_counter()
    pool = ToolPool(registry, workers=args.workers, timeout_s=10.0, isolation=args.isolation)
    start_s = time.perf_counter() - t0
    try:
        sync_lat = []
        t0 = time.perf_counter()
        for c in calls:
            t = time.perf_counter()
            pool.call(c)
            sync_lat.append(time.perf_counter() - t)
        sync_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        async_lat = asyncio.run(_async_run(pool, calls, args.concurrency))
        async_s = time.perf_counter() - t0

        crash_lat = []
        for _ in range(args.crashes):
            t = time.perf_counter()
            pool.call(ToolCall("die", {"code": 3}))
            pool.call(calls[0])  # waits for the replacement to be ready
            crash_lat.append(time.perf_counter() - t)
        counters, restarts = dict(pool.counters), pool.restarts
    finally:
        pool.close()

    n = args.calls
    result = {
        "bench": "tool_pool",
        "calls": n,
        "workers": args.workers,
        "isolation": pool.isolation.get("os", args.isolation),
        "pool_start_s": round(start_s, 4),
        "direct_calls_per_s": round(n / direct_s, 1),
        "sync_calls_per_s": round(n / sync_s, 1),
        "sync_p50_ms": round(statistics.median(sync_lat) * 1e3, 3),
        "sync_p99_ms": round(_pct(sync_lat, 0.99) * 1e3, 3),
        "async_calls_per_s": round(n / async_s, 1),
        "async_concurrency": args.concurrency,
        "async_p50_ms": round(statistics.median(async_lat) * 1e3, 3),
        "async_p99_ms": round(_pct(async_lat, 0.99) * 1e3, 3),
        "async_over_sync": round(sync_s / async_s, 3),
        "direct_over_sync": round(sync_s / direct_s, 1),
        "crash_replace_p50_ms": round(statistics.median(crash_lat) * 1e3, 2),
        "crash_replace_p99_ms": round(_pct(crash_lat, 0.99) * 1e3, 2),
        "counters": counters,
        "restarts": restarts,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
