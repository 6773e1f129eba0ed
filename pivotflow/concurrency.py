"""Structured concurrency for the run's side tasks (asyncio.TaskGroup, Python 3.11)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
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
