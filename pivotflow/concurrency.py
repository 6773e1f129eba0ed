"""Structured concurrency for the run's side tasks (asyncio.TaskGroup, Python 3.11)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def serve_beside(main: Awaitable[T], *side: Coroutine[Any, Any, None]) -> T:
    """Await ``main`` with ``side`` tasks running beside it in a task group: they are
    cancelled when ``main`` ends, and the first error, ``main``'s or a side task's (which
    cancels ``main``), is raised as itself rather than as an exception group, so callers keep
    catching the error types they know."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(coro) for coro in side]
            try:
                return await main
            finally:
                for task in tasks:
                    task.cancel()
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0]  # noqa: B904 - the error itself, its own traceback kept


async def closed_at_shutdown(close: Callable[[], Awaitable[Any]]) -> AsyncIterator[None]:
    """A handle that runs ``close`` when this loop shuts down: the loop's runner
    (``asyncio.run``, the run's ``asyncio.Runner``) closes every async generator left open
    before it closes, which runs the generator's ``finally``. Keep the handle referenced for as
    long as what it closes lives (a generator no one holds is closed when it is collected):
    what a loop's first user opens (a session, processes, servers) then ends with the loop,
    never on a loop that is gone."""
    keeper = _open_until_closed(close)
    await anext(keeper)
    return keeper


async def _open_until_closed(close: Callable[[], Awaitable[Any]]) -> AsyncIterator[None]:
    try:
        yield
        await asyncio.Event().wait()  # (never resumed: closed from outside)
    finally:
        await close()
