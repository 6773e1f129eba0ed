"""ToolPool: run tool calls in sandboxed worker processes; every failure is an observation.

Each call is checked here first (known tool, argument size, argument schema), then runs in one
of ``workers`` long-lived processes (``pivotflow.tools.sandbox``), each in a bubblewrap sandbox
of its own (``bwrap.py``: uid 65534, read-only system, private /tmp, own pid and network
namespaces), under a wall timeout, CPU-time, memory, process-count and file-size limits and an
output cap. Without bubblewrap the pool refuses to start unless ``isolation="none"`` says so
(then a warning is logged: tools run with the controller's uid and filesystem view). A worker that hangs, crashes, loops,
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
import logging
import os
import queue
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pivotflow.errors import ConfigError, ToolCallError, ToolError
from pivotflow.tools import bwrap
from pivotflow.tools.parsers import ToolCall
from pivotflow.tools.process import WorkerProcess, describe_exit
from pivotflow.tools.registry import Tool, ToolRegistry

log = logging.getLogger("pivotflow.tools")

ISOLATION = ("bwrap", "none")
ROOT_NPROC = 64  # processes + threads of uid 65534, shared by every isolated worker


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
        isolation: str = "bwrap",
        file_size_mb: int | None = 16,
        open_files: int | None = 256,
        tmp_mb: int = 64,
        hidden_paths: tuple[str, ...] = (),
        sandbox_url: str | list[str] | None = None,
        sandbox_token: str = "",
    ) -> None:
        """Start ``workers`` processes and wait until each is ready.

        ``cpu_s`` defaults to ``timeout_s``; ``memory_mb`` is address space a tool may add over
        the worker's size after importing its tools (None: no limit); ``nproc`` sets
        RLIMIT_NPROC, a cap on all processes and threads of the worker's uid, not just this
        worker's (default: ROOT_NPROC when the pool, run as root, isolates to uid 65534;
        else none); ``file_size_mb`` caps each file a tool writes, ``open_files`` its file
        descriptors, ``tmp_mb`` its private /tmp. ``isolation`` is "bwrap" (the default) or
        "none" (explicitly no OS isolation; logged as a warning); ``hidden_paths`` (e.g. the
        run folder) are masked if they lie inside a folder the workers see. A tool with
        ``sandbox="python"`` (``code_interpreter``) runs in the code sandbox instead
        (``code_interpreter.CodeInterpreter``: ``workers`` programs at once, under
        ``timeout_s``, ``memory_mb``, ``nproc`` and ``isolation``), or on the sandbox servers
        at ``sandbox_url`` (with ``sandbox_token``); a pool of such tools alone starts no
        worker.
        Raises ConfigError for a non-positive limit or an unknown ``isolation``, ToolError if
        bubblewrap is unavailable, a tool cannot be imported by path or a worker fails to start.
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
            ("file_size_mb", file_size_mb or 1),
            ("open_files", open_files or 1),
            ("tmp_mb", tmp_mb),
        ):
            _positive(key, val)
        if isolation not in ISOLATION:
            raise ConfigError(
                f"ToolPool: isolation must be one of {', '.join(ISOLATION)}, got {isolation!r}"
            )
        refs = {}
        for t in registry:
            if t.sandbox is not None:
                continue  # (runs in the code sandbox: self._code)
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
        self._wall = self._isolate(isolation, list(refs.values()), hidden_paths, tmp_mb)
        isolated = self._wall is not None
        if nproc is None and isolated and os.geteuid() == 0:
            nproc = ROOT_NPROC
        self._config = {
            # absolute: a worker's working folder is its own (with bwrap, its private /tmp)
            "sys_path": [os.path.abspath(p) for p in sys.path],
            "tools": refs,
            "memory_mb": memory_mb,
            "max_output_chars": max_output_chars,
            "netns": net_namespace,
            "nproc": nproc,
            "isolated": isolated,
            "file_size_mb": file_size_mb,
            "open_files": open_files,
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
        # bwrap's --die-with-parent kills a worker when the *thread* that started it ends
        # (PR_SET_PDEATHSIG follows the forking thread, not the process), so a worker started
        # by a caller's short-lived thread died with it, at random, before its next call: every
        # worker is started from this one thread, which lives as long as the pool
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="pivotflow-tool-spawner")
        self._code = None
        if any(t.sandbox is not None for t in registry):
            from pivotflow.tools.code_interpreter import CodeInterpreter

            self._code = CodeInterpreter(
                workers=workers, timeout_s=timeout_s, memory_mb=memory_mb, nproc=nproc,
                isolation=isolation, max_output_chars=max_output_chars,
                sandbox_url=sandbox_url, sandbox_token=sandbox_token)
        try:
            started = [self._spawn() for _ in range(workers if refs else 0)]
            for w in started:
                why = self._await_ready(w)
                if why is not None:
                    raise ToolError(f"tool worker failed to start: {why}")
                self._idle.put(w)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _isolate(
        isolation: str, refs: list[str], hidden: tuple[str, ...], tmp_mb: int
    ) -> list[str] | None:
        """The bwrap command line the workers start behind, or None for ``isolation="none"``;
        raises ToolError if bubblewrap cannot sandbox here (untrusted code must not run
        unconfined because a package is missing)."""
        if isolation == "none":
            log.warning(
                "tool pool: isolation=none: tools run WITHOUT operating-system isolation, "
                "with this process's uid and view of the filesystem (only rlimits and an "
                "audit hook confine them); use it for trusted tools only"
            )
            return None
        try:
            return bwrap.sandbox_command(refs, hidden, tmp_mb)
        except bwrap.Unavailable as why:
            raise ToolError(
                f"tool pool: cannot isolate tool calls: {why}; install bubblewrap "
                "(apt-get install bubblewrap) or set tool_pool.isolation=none to run tools "
                "without isolation"
            ) from None

    # -- calls ------------------------------------------------------------------------------

    def call(self, call: ToolCall | ToolCallError) -> ToolResult:
        """Run one call (a ToolCallError from a parser becomes a "parse" observation).

        Never raises for anything the call or the tool does; raises ToolError only if the pool
        is closed.
        """
        if self._closed:
            raise ToolError("ToolPool.call after close()")
        checked = self._checked(call)
        if isinstance(checked, ToolResult):
            return checked
        ok, tool = checked
        if tool.sandbox is not None:  # (a thread with no event loop of its own)
            assert self._code is not None
            return self._count(self._code.call_sync(ok.name, ok.arguments))
        return self._in_a_worker(ok)

    def _checked(self, call: ToolCall | ToolCallError) -> tuple[ToolCall, Tool] | ToolResult:
        """The call, if it may run: a known tool, arguments within the cap and its schema;
        else the failed call's observation."""
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
        return call, tool

    def _in_a_worker(self, call: ToolCall) -> ToolResult:
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
        checked = self._checked(call)
        if isinstance(checked, ToolResult):
            return checked
        ok, tool = checked
        if tool.sandbox is not None:  # (the code sandbox waits on this loop)
            assert self._code is not None
            return self._count(await self._code.call(ok.name, ok.arguments))
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self._in_a_worker, ok)

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
        """Start a worker from the spawner thread (see ``__init__``); raises OSError if it
        cannot start, RuntimeError once the pool is closed."""
        w = self._spawner.submit(WorkerProcess, self._config, self._wall).result()
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
        except (OSError, RuntimeError):  # RuntimeError: closed meanwhile (spawner shut down)
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
        self._spawner.shutdown(wait=False, cancel_futures=True)

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
