"""ToolPool: run tool calls in sandboxed worker processes; every failure is an observation.

Each call is checked here first (known tool, argument size, argument schema), then runs in one
of ``workers`` long-lived processes (``pivotflow.tools.sandbox``) under a wall timeout, a CPU-time
limit, a memory limit, no network and an output cap. A worker that hangs, crashes, loops,
forks, runs out of memory or writes too much is killed with its process group and replaced.
The caller always gets a ``ToolResult``; its ``content`` is what the policy reads (for a failure,
``"Error: ..."``), ``kind`` says what happened and ``counters[kind]`` counts it.

Kinds: ok, truncated (ok but cut to ``max_output_chars``), parse, unknown_tool, arguments,
too_large, error (the tool raised), timeout, cpu, memory, network, fork, forbidden, output
(reply over the byte cap), crash, closed. How strong each limit is: see ``sandbox``'s docstring.
"""

from __future__ import annotations

import asyncio
import json
import queue
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pivotflow.errors import ConfigError, ToolCallError, ToolError
from pivotflow.tools.parsers import ToolCall
from pivotflow.tools.process import WorkerProcess, describe_exit
from pivotflow.tools.registry import ToolRegistry


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What one call gave: the text the policy sees, the error (None if it worked), the kind."""

    content: str
    error: str | None = None
    kind: str = "ok"
    name: str = ""

    @property
    def ok(self) -> bool:
        """True when the tool ran and returned (its output possibly truncated)."""
        return self.error is None


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"ToolPool: {name} must be > 0, got {value!r}")


class ToolPool:
    """Sandboxed processes that run the tools of a registry; see the module docstring."""

    def __init__(
        self,
        registry: ToolRegistry,
        workers: int = 2,
        *,
        timeout_s: float = 5.0,
        cpu_s: float | None = None,
        memory_mb: int | None = 512,
        max_output_chars: int = 4096,
        max_argument_chars: int = 16384,
        start_timeout_s: float = 30.0,
        max_calls_per_worker: int = 1000,
        net_namespace: bool = True,
        nproc: int | None = None,
    ) -> None:
        """Start ``workers`` processes and wait until each is ready.

        ``cpu_s`` defaults to ``timeout_s``; ``memory_mb`` is address space a tool may add over
        the worker's size after importing its tools (None: no limit); ``nproc`` sets
        RLIMIT_NPROC (a cap on all processes
        and threads of the user, not just this worker's; root ignores it) for non-root users. Raises ConfigError for a
        non-positive limit, ToolError if a tool cannot be imported by path or a worker fails
        to start.
        """
        for key, val in (
            ("workers", workers),
            ("timeout_s", timeout_s),
            ("max_output_chars", max_output_chars),
            ("max_argument_chars", max_argument_chars),
            ("start_timeout_s", start_timeout_s),
            ("max_calls_per_worker", max_calls_per_worker),
            ("cpu_s", cpu_s or 1),
            ("memory_mb", memory_mb or 1),
        ):
            _positive(key, val)
        refs = {}
        for t in registry:
            if t.ref is None:
                raise ToolError(
                    f"tool {t.name!r} cannot run in the tool pool: its worker "
                    "processes import tools by 'module:attr', so define it at the "
                    "top level of an importable module (not __main__ or a function)"
                )
            refs[t.name] = t.ref
        self.registry = registry
        self.timeout_s, self.cpu_s = timeout_s, cpu_s if cpu_s is not None else timeout_s
        self.memory_mb, self.max_output_chars = memory_mb, max_output_chars
        self.max_argument_chars, self.start_timeout_s = max_argument_chars, start_timeout_s
        self.max_calls_per_worker = max_calls_per_worker
        self._config = {
            "sys_path": list(sys.path),
            "tools": refs,
            "memory_mb": memory_mb,
            "max_output_chars": max_output_chars,
            "netns": net_namespace,
            "nproc": nproc,
        }
        self._reply_cap = max_output_chars * 6 + 4096  # JSON escapes take at most 6 bytes a char
        self.counters: Counter[str] = Counter()
        self.restarts = 0  # workers replaced, after a failure or after max_calls_per_worker
        self.isolation: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._all: list[WorkerProcess] = []
        self._idle: queue.SimpleQueue[WorkerProcess] = queue.SimpleQueue()
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="pivotflow-tools")
        try:
            started = [self._spawn() for _ in range(workers)]
            for w in started:
                why = self._await_ready(w)
                if why is not None:
                    raise ToolError(f"tool worker failed to start: {why}")
                self._idle.put(w)
        except BaseException:
            self.close()
            raise

    # -- calls ------------------------------------------------------------------------------

    def call(self, call: ToolCall | ToolCallError) -> ToolResult:
        """Run one call (a ToolCallError from a parser becomes a "parse" observation).

        Never raises for anything the call or the tool does; raises ToolError only if the pool
        is closed.
        """
        if self._closed:
            raise ToolError("ToolPool.call after close()")
        if isinstance(call, ToolCallError):
            return self._fail("", "parse", f"could not read the tool call: {call}")
        if call.name not in self.registry:
            known = ", ".join(self.registry.names) or "none"
            return self._fail(
                call.name, "unknown_tool", f"unknown tool {call.name!r}; available tools: {known}"
            )
        tool = self.registry.get(call.name)
        try:
            size = len(json.dumps(call.arguments, ensure_ascii=False))
        except (TypeError, ValueError, RecursionError) as exc:
            return self._fail(
                call.name, "arguments", f"tool {call.name!r}: arguments are not JSON: {exc}"
            )
        if size > self.max_argument_chars:
            return self._fail(
                call.name,
                "too_large",
                f"tool {call.name!r}: arguments are {size} characters; the cap "
                f"is {self.max_argument_chars}",
            )
        try:
            tool.validate(call.arguments)
        except ToolCallError as exc:
            return self._fail(call.name, "arguments", str(exc))
        worker = self._idle.get()
        try:
            result, worker = self._exchange(worker, call)
        finally:
            self._idle.put(worker)
        return self._count(result)

    def call_all(self, calls: list[ToolCall] | ToolCallError) -> list[ToolResult]:
        """Run what a parser returned, in order: its calls, or its error as one observation."""
        if isinstance(calls, ToolCallError):
            return [self.call(calls)]
        return [self.call(c) for c in calls]

    async def acall(self, call: ToolCall | ToolCallError) -> ToolResult:
        """``call`` on the pool's threads, so the event loop never blocks on a tool.

        Raises ToolError only if the pool is closed.
        """
        if self._closed:
            raise ToolError("ToolPool.acall after close()")
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.call, call)

    async def acall_all(self, calls: list[ToolCall] | ToolCallError) -> list[ToolResult]:
        """``call_all`` without blocking the event loop; the calls run concurrently."""
        if isinstance(calls, ToolCallError):
            return [await self.acall(calls)]
        return list(await asyncio.gather(*(self.acall(c) for c in calls)))

    # -- workers ----------------------------------------------------------------------------

    def _exchange(self, w: WorkerProcess, call: ToolCall) -> tuple[ToolResult, WorkerProcess]:
        name = call.name
        if not w.ready:
            why = self._await_ready(w)
            if why is not None:
                return self._broken(
                    name, "crash", f"its worker failed to start: {why}"
                ), self._replace(w)
        w.calls += 1
        if not w.send(
            {"id": w.calls, "name": name, "arguments": call.arguments, "cpu_s": self.cpu_s}
        ):
            return self._died(w, name), self._replace(w)
        status, reply = w.recv(self.timeout_s, self._reply_cap)
        if status == "timeout":
            return self._broken(
                name, "timeout", f"timed out after {self.timeout_s:g} s and was killed"
            ), self._replace(w)
        if status == "too_long":
            return self._broken(
                name, "output", f"wrote a reply over {self._reply_cap} bytes and was killed"
            ), self._replace(w)
        if status == "gone":
            return self._died(w, name), self._replace(w)
        recycle = bool(reply.get("recycle")) or w.calls >= self.max_calls_per_worker
        return self._from_reply(name, reply), (self._replace(w) if recycle else w)

    def _from_reply(self, name: str, reply: dict[str, Any]) -> ToolResult:
        kind, error = str(reply.get("kind", "crash")), reply.get("error")
        content = str(reply.get("content", ""))
        if error is None and kind == "ok":
            if reply.get("truncated"):
                note = (
                    f"\n[output truncated: {reply.get('chars')} characters, cap "
                    f"{self.max_output_chars}]"
                )
                return ToolResult(content + note, None, "truncated", name)
            return ToolResult(content, None, "ok", name)
        if kind == "error":
            return self._broken(name, kind, f"raised {error}")
        if kind == "memory":
            return self._broken(
                name, kind, f"{error} (limit: {self.memory_mb} MB over its base size)"
            )
        return self._broken(name, kind, str(error))

    def _died(self, w: WorkerProcess, name: str) -> ToolResult:
        if self._closed:
            return ToolResult("Error: the tool pool was closed", "closed", "closed", name)
        kind, words = describe_exit(w.exit_status())
        if kind == "cpu":
            return self._broken(
                name,
                kind,
                f"exceeded its CPU-time limit of {self.cpu_s:g} s and was killed ({words})",
            )
        return self._broken(name, kind, words)

    def _broken(self, name: str, kind: str, what: str) -> ToolResult:
        error = f"tool {name!r} {what}" if name else what
        return ToolResult(f"Error: {error}", error, kind, name)

    def _fail(self, name: str, kind: str, error: str) -> ToolResult:
        return self._count(ToolResult(f"Error: {error}", error, kind, name))

    def _count(self, result: ToolResult) -> ToolResult:
        with self._lock:
            self.counters[result.kind] += 1
        return result

    def _spawn(self) -> WorkerProcess:
        w = WorkerProcess(self._config)
        with self._lock:
            self._all.append(w)
        return w

    def _await_ready(self, w: WorkerProcess) -> str | None:
        status, reply = w.recv(self.start_timeout_s, 1 << 20)
        if status == "ok" and reply.get("ready"):
            w.ready, w.isolation = True, reply.get("isolation", {})
            self.isolation = w.isolation
            return None
        if status == "ok":
            return str(reply.get("error"))
        return "no answer in time" if status == "timeout" else describe_exit(w.exit_status())[1]

    def _replace(self, w: WorkerProcess) -> WorkerProcess:
        w.kill()
        with self._lock:
            if w in self._all:
                self._all.remove(w)
            self.restarts += 0 if self._closed else 1
        if self._closed:
            return w
        try:
            return self._spawn()  # becomes ready while the caller reads its result
        except OSError:
            return w  # not ready: the next call retries the start and reports it

    # -- lifetime ---------------------------------------------------------------------------

    def pids(self) -> list[int]:
        """Process ids of the live workers (each leads its own process group)."""
        with self._lock:
            return [w.pid for w in self._all]

    def close(self) -> None:
        """Kill every worker with its process group and reap it; idempotent."""
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            workers, self._all = list(self._all), []
        for w in workers:
            w.kill()

    def __enter__(self) -> ToolPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> ToolPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """``close`` off the event loop (killing and reaping can take a moment)."""
        await asyncio.get_running_loop().run_in_executor(None, self.close)
