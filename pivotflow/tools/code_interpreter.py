"""A Python interpreter as a tool: tool-integrated reasoning (ToRL, SimpleTIR, verl's ReTool),
where the policy writes code mid-answer and reads what it prints.

    g.generate("rollout", ..., tools="pivotflow.tools.code_interpreter:code_interpreter",
               tool_pool={"workers": 4, "timeout_s": 10, "memory_mb": 512})

The policy calls ``code_interpreter`` with ``{"code": "..."}``. Tool workers may not start
processes (``tools/sandbox.py``), so this tool does not run in them: the ``ToolPool`` sends its
calls to the code reward's sandbox (``CodeRunner.run_raw``: a bubblewrap sandbox a call, the
program a process forked from a clean ``python -S -I``, as a slot's own uid, under the pool's
``timeout_s``, ``memory_mb`` and ``nproc``), on the controller's loop, ``workers`` at once; or,
with the pool's ``sandbox_url``, to sandbox servers (``python -m pivotflow.rl.sandbox_server``
on other hosts, or a SandboxFusion deployment: ``/run_code``, what verl's ReTool recipe calls).

What the policy reads: the program's stdout; where it failed, the stdout and the last lines of
its traceback; a timeout, a memory or CPU limit, a crash or an output cap said in one
``Error:`` line. Decision: each call is a fresh interpreter, as SandboxFusion's ``run_code``
is (no state from the trajectory's earlier calls; the description tells the policy so), and
the standard library only (``-S``: no site packages, as the code reward runs programs).
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from typing import Any

from pivotflow.errors import ToolError
from pivotflow.tools.registry import Tool, tool

TRACEBACK_LINES = 8  # of a failed program's stderr, what a person would read first


def _interpreter(code: str) -> str:
    """Run a Python 3 program and return what it prints: its stdout, and its traceback's last
    lines where it fails. Each call is a fresh interpreter with the standard library: define
    what you use, and print what you want to see.

    Args:
        code: the program.
    """
    raise ToolError("code_interpreter runs in the code sandbox, called through a ToolPool")


code_interpreter: Tool = dataclasses.replace(tool(name="code_interpreter")(_interpreter),
                                             sandbox="python")


class CodeInterpreter:
    """Runs a ``sandbox="python"`` tool's calls: the ``code`` argument as a program, here in
    code sandboxes or on sandbox servers; each call's observation as a ``ToolResult``."""

    def __init__(self, *, workers: int, timeout_s: float, memory_mb: int | None,
                 nproc: int | None, isolation: str, max_output_chars: int,
                 sandbox_url: str | list[str] | None = None, sandbox_token: str = "") -> None:
        from pivotflow.rl.code_sandbox import CodeRunner
        from pivotflow.rl.sandbox_client import RemoteRunner

        self.timeout_s, self.max_output_chars = timeout_s, max_output_chars
        memory = memory_mb or 512
        self.runner: CodeRunner | RemoteRunner
        try:
            if sandbox_url:
                urls = sandbox_url.split(",") if isinstance(sandbox_url, str) else list(sandbox_url)
                self.runner = RemoteRunner(urls, workers=workers, timeout_s=timeout_s,
                                           memory_mb=memory, token=sandbox_token)
            else:
                self.runner = CodeRunner(workers=workers, timeout_s=timeout_s, memory_mb=memory,
                                         nproc=nproc or 64, isolation=isolation)
        except ValueError as why:
            raise ToolError(f"code_interpreter: {why}") from None

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """The observation of one call (a ``ToolResult``); never raises for what the program
        does."""
        ran = await self.runner.run_raw(str(arguments["code"]), "")
        return self.observation(name, ran)

    def call_sync(self, name: str, arguments: dict[str, Any]) -> Any:
        """``call`` from a thread without an event loop (``ToolPool.call``)."""
        return asyncio.run(self.call(name, arguments))

    def observation(self, name: str, raw: dict[str, Any]) -> Any:
        from pivotflow.tools.pool import ToolResult

        def failed(kind: str, what: str, shown: str = "") -> ToolResult:
            error = f"tool {name!r}: {what}"
            return ToolResult(self._cut(shown + f"Error: {what}"), error, kind, name)

        if "sandbox" in raw:
            return failed("crash", f"the sandbox failed: {raw['sandbox']}")
        ran = raw["run"]
        if "error" in ran:
            return failed("crash", f"the sandbox could not run the program: {ran['error']}")
        stdout = str(ran.get("stdout") or "")
        if not ran["ended"]:
            return failed("timeout", f"the program ran past {self.timeout_s:g} s and was "
                          "killed", _shown(stdout))
        if ran.get("stdout_cut"):
            return failed("output", "the program printed too much (over 1 MiB)")
        status, stderr = int(ran["status"]), str(ran.get("stderr") or "")
        tail = "\n".join(stderr.strip().splitlines()[-TRACEBACK_LINES:])
        if status < 0:
            kind = "cpu" if -status == signal.SIGXCPU else "crash"
            return failed(kind, f"the program was killed by signal {-status}", _shown(stdout))
        if status != 0:
            kind = "memory" if "MemoryError" in tail else "error"
            return ToolResult(self._cut(_shown(stdout) + tail, keep_end=True),
                              f"tool {name!r}: the program exited {status}", kind, name)
        text = stdout if stdout.strip() else "(no output: print what you want to see)"
        if len(text) > self.max_output_chars:
            return ToolResult(self._cut(text), None, "truncated", name)
        return ToolResult(text, None, "ok", name)

    def _cut(self, text: str, keep_end: bool = False) -> str:
        """``text`` within the pool's ``max_output_chars``: its start, or where it ends in a
        traceback its end (the error is in the last line)."""
        cap = self.max_output_chars
        if len(text) <= cap:
            return text
        if keep_end:
            return f"[output truncated: {len(text)} characters, cap {cap}]\n" + text[-cap:]
        return text[:cap] + f"\n[output truncated: {len(text)} characters, cap {cap}]"


def _shown(stdout: str) -> str:
    """What the program printed before it failed, ahead of the error."""
    return stdout if not stdout or stdout.endswith("\n") else stdout + "\n"
