"""Real processes for tests that need several (a trainers' group, two nodes): each started with
``spawn`` (a fresh interpreter: no forked torch or gloo state), each putting one result on a
queue."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Sequence
from typing import Any


def run_spawned(target: Callable[..., None], arg_tuples: Sequence[tuple[Any, ...]],
                timeout: float = 90.0) -> list[Any]:
    """``target(*args, queue)`` in a process of its own for each ``args``; each puts one result
    on the queue. Returns the results in the order they came (the processes' order of
    finishing), once every process has exited 0."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, q)) for args in arg_tuples]
    for p in procs:
        p.start()
    results = [q.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return results
