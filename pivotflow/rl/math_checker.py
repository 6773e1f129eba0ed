"""The algebra of math answers, in processes of their own, each answer under a time limit.

sympy can run for ever on an answer a model writes (``9^{9^{9^{9}}}``, a simplification that
never ends) and holds the interpreter while it does: on the controller's loop it would stop the
run. So ``MathCheckers`` keeps ``workers`` processes (``python -m pivotflow.rl.math_checker``),
each started once, sympy imported once, and sends each one answer pair at a time as a JSON line;
a check that outlives ``timeout_s`` has its process killed (the next check starts a fresh one)
and is scored as not equal. Each process caps its own address space (``memory_mb``) and exits
when its parent is gone (its stdin closes; or, mid-check, the kernel kills it: the parent's
death signal).

The processes of a loop are closed when that loop shuts down (``concurrency.closed_at_shutdown``),
as ``http_calls`` closes its sessions.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import weakref
from collections.abc import AsyncIterator
from typing import Any

from pivotflow.concurrency import closed_at_shutdown

START_TIMEOUT_S = 120.0  # importing sympy on a busy host: seconds, not minutes


class MathCheckers:
    """``workers`` checker processes, shared by the calls of one loop."""

    def __init__(self, workers: int = 1, timeout_s: float = 5.0, memory_mb: int = 2048) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"math checkers: workers must be a whole number >= 1, got "
                             f"{workers!r}")
        if not timeout_s > 0:
            raise ValueError(f"math checkers: timeout_s must be > 0, got {timeout_s!r}")
        self.workers, self.timeout_s, self.memory_mb = workers, timeout_s, memory_mb
        self._idle: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop,
            tuple[asyncio.Queue[_Checker], AsyncIterator[None]]] = weakref.WeakKeyDictionary()

    async def check(self, pred: str, gold: str) -> tuple[bool | None, str]:
        """Whether the normalized answers ``pred`` and ``gold`` are the same, and how it was
        decided: ``"algebra"``; ``"timeout"`` or ``"error"`` (with None: nothing decided, the
        process killed or dead and started again at the next check)."""
        idle = await self._queue()
        checker = await idle.get()
        try:
            return await checker.check(pred, gold, self.timeout_s)
        finally:
            idle.put_nowait(checker)

    def pids(self) -> list[int]:
        """The process ids of the running loop's checkers that are up and idle."""
        held = self._idle.get(asyncio.get_running_loop())
        checkers = list(held[0]._queue) if held is not None else []  # type: ignore[attr-defined]
        return [c.proc.pid for c in checkers if c.proc is not None and c.proc.returncode is None]

    async def _queue(self) -> asyncio.Queue[_Checker]:
        loop = asyncio.get_running_loop()
        held = self._idle.get(loop)
        if held is None:
            checkers = [_Checker(self.memory_mb) for _ in range(self.workers)]
            idle: asyncio.Queue[_Checker] = asyncio.Queue()
            for checker in checkers:
                idle.put_nowait(checker)

            async def close() -> None:
                for checker in checkers:
                    await checker.close()

            held = self._idle[loop] = (idle, await closed_at_shutdown(close))
        return held[0]


class _Checker:
    """One process, started at its first check and after each that killed it."""

    def __init__(self, memory_mb: int) -> None:
        self.memory_mb = memory_mb
        self.proc: asyncio.subprocess.Process | None = None

    async def check(self, pred: str, gold: str, timeout_s: float) -> tuple[bool | None, str]:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            proc = self.proc = await self._started()
            if proc is None:
                return None, "error"
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps({"pred": pred, "gold": gold}).encode() + b"\n")
            line = await asyncio.wait_for(proc.stdout.readline(), timeout_s)
            answer = json.loads(line)
        except TimeoutError:
            await self.close()
            return None, "timeout"
        except (OSError, ValueError):  # it died (the line is empty) or wrote garbage
            await self.close()
            return None, "error"
        equal = answer.get("equal") if isinstance(answer, dict) else None
        return (equal, "algebra") if isinstance(equal, bool) else (None, "error")

    async def _started(self) -> asyncio.subprocess.Process | None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pivotflow.rl.math_checker", str(self.memory_mb),
            str(os.getpid()),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL)
        assert proc.stdout is not None
        try:  # its first line says sympy is in: the check's time limit starts after
            ready = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)
        except TimeoutError:
            ready = b""
        if ready.strip() != b"ready":
            self.proc = proc
            await self.close()
            return None
        return proc

    async def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()


# --- the process ----------------------------------------------------------------------------

def _die_with_parent(parent: int | None) -> None:
    """Have the kernel kill this process when the one that started it goes (a check may hold
    the interpreter for minutes inside one C call, ``9^{9^{9}}``'s power: no thread of ours
    could run to notice), and exit now if it is already gone."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if parent is not None and os.getppid() != parent:
        os._exit(0)


def _answer(request: Any) -> dict[str, Any]:
    from pivotflow.rl.latex_expr import algebra_leaf
    from pivotflow.rl.math_answer import equivalent

    if not (isinstance(request, dict) and isinstance(request.get("pred"), str)
            and isinstance(request.get("gold"), str)):
        return {"equal": None, "error": "a request is {pred: str, gold: str}"}
    try:
        return {"equal": bool(equivalent(request["pred"], request["gold"], algebra_leaf))}
    except (MemoryError, RecursionError) as exc:
        return {"equal": None, "error": type(exc).__name__}


def main(argv: list[str]) -> None:
    import resource

    limit = int(argv[0]) * 2**20 if argv else 2 * 2**30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    _die_with_parent(int(argv[1]) if len(argv) > 1 else None)
    import pivotflow.rl.latex_expr  # noqa: F401  (sympy, before saying it is ready)

    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
        except ValueError:
            request = None
        sys.stdout.write(json.dumps(_answer(request)) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
