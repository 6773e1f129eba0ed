"""The code reward's local sandboxes: ``CodeRunner`` runs programs, ``workers`` at once, each in a
bubblewrap sandbox of its own under ``code_runner.py`` (which runs each case as a process forked
from its case forker, ``case_forker.py``). ``run`` judges a program on its cases (``code_reward``);
``run_raw`` runs one on one input and says how it ran (``sandbox_server.py``'s answers)."""

from __future__ import annotations

import asyncio
import json
import logging
import marshal
import random
import shutil
import sys
import weakref
from pathlib import Path
from typing import Any

from pivotflow.rl import cxx_header
from pivotflow.rl.code_runner import runner_cases
from pivotflow.tools import bwrap

log = logging.getLogger("pivotflow.code_reward")

RUNNER = str(Path(__file__).with_name("code_runner.py"))
# the uids the cases run as (as root): a block of `workers` drawn from here, held by no user
UID_FIRST, UID_LAST = 1_000_000, 2_000_000_000
COMPILE_WALL_S = 31.0  # a C++ compile's time limit in the sandbox (code_runner's), and its exit


class CodeRunner:
    """Runs programs in sandboxes, ``workers`` at once (each a bwrap process of its own)."""

    def __init__(self, *, workers: int, timeout_s: float, memory_mb: int, nproc: int,
                 isolation: str, compiles: bool = False) -> None:
        if isolation not in ("bwrap", "none"):
            raise ValueError(f"code_reward: isolation must be bwrap or none, got {isolation!r}")
        for name, value in (("workers", workers), ("timeout_s", timeout_s),
                            ("memory_mb", memory_mb), ("nproc", nproc)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"code_reward: {name} must be > 0, got {value!r}")
        self.workers, self.timeout_s = int(workers), float(timeout_s)
        self.memory_mb, self.nproc = int(memory_mb), int(nproc)
        # C++ (``compiles``): g++ as the host has it, under /usr (the sandbox's read-only /usr)
        self.compiler = (shutil.which("g++") or "") if compiles else ""
        if compiles and not self.compiler:
            raise ValueError("code_reward: C++ programs need g++, which is not on PATH; "
                             "install it (apt-get install g++) or use language='python'")
        # (C++: where the precompiled <bits/stdc++.h> is, or will be: cxx_header.py)
        self.header = cxx_header.header_folder(self.compiler) if self.compiler else None
        if self.header is not None:
            self.header.mkdir(parents=True, exist_ok=True)  # (bound into each sandbox)
        self.prefix: list[str] = []
        if isolation == "bwrap":
            try:
                self.prefix = bwrap.sandbox_command(
                    extra=[str(self.header)] if self.header is not None else [])
            except bwrap.Unavailable as why:
                raise ValueError(f"code_reward: {why}; install bubblewrap, or pass "
                                 "isolation='none' to run programs unsandboxed") from None
        else:
            log.warning("code_reward: isolation='none': programs run without a sandbox")
        # Each sandbox slot's cases run as a uid of its own (as root; code_runner.py says
        # why), from a block no user holds, drawn at random so that two runners on one host
        # (two runs, two test processes) do not share one.
        self.uid_base = random.SystemRandom().randrange(UID_FIRST, UID_LAST - self.workers)
        # (a queue or lock belongs to the loop it is first used on: one per loop)
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Queue[int]] \
            = weakref.WeakKeyDictionary()
        self._header_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                                      asyncio.Lock] = weakref.WeakKeyDictionary()
        self._header_failed = False

    async def run(self, code: str, cases: list[dict[str, Any]], stop_at_failure: bool,
                  language: str = "python", *, timeout_s: float | None = None,
                  memory_mb: int | None = None,
                  defer_stdio: bool = False) -> list[dict[str, Any]]:
        """Each case's outcome (``{"outcome": "ok" | ..., "why": ...}``); a sandbox that
        breaks gives every case the outcome ``sandbox``. ``language`` "cpp": the program is
        compiled first (stdin/stdout cases only; a runner built with ``compiles``).
        ``timeout_s`` and ``memory_mb`` (a case's) over the runner's own. ``defer_stdio``: a
        stdin/stdout case that exited 0 comes back ``ran`` with its stdout, unjudged (for a
        checker: ``code_runner.judged``)."""
        if language == "cpp" and not self.compiler:
            raise ValueError("code_reward: this runner was not built for C++ programs")
        cases = runner_cases(cases, language)
        timeout_s = self.timeout_s if timeout_s is None else float(timeout_s)
        job = {"code": code, "cases": cases, "stop_at_failure": stop_at_failure,
               "timeout_s": timeout_s, "defer_stdio": defer_stdio,
               "memory_mb": self.memory_mb if memory_mb is None else int(memory_mb)}
        # each case's timeout, its start-up, and the sandbox's own
        wall = len(cases) * (timeout_s + 1.0) + 10.0
        answer, why = await self._in_a_sandbox(job, language, wall)
        if answer is not None and len(answer.get("cases", ())) == len(cases):
            return list(answer["cases"])
        if why.startswith("timeout:"):
            return [{"outcome": "timeout", "why": why[8:]} for _ in cases]
        return [{"outcome": "sandbox", "why": why} for _ in cases]

    async def run_raw(self, code: str, stdin: str, language: str = "python", *,
                      timeout_s: float | None = None,
                      memory_mb: int | None = None) -> dict[str, Any]:
        """How ``code`` ran on one input, unjudged (a sandbox server's answer:
        ``sandbox_server.py``): ``{"compile": run or None, "run": run or None}``, each run as
        ``code_runner.outcome_of`` reads it, or ``{"sandbox": why}`` when the sandbox itself
        failed. ``timeout_s`` and ``memory_mb`` over the runner's own."""
        if language == "cpp" and not self.compiler:
            raise ValueError("code_reward: this runner was not built for C++ programs")
        timeout_s = self.timeout_s if timeout_s is None else float(timeout_s)
        job = {"code": code, "cases": [], "stop_at_failure": False, "raw": True,
               "stdin": stdin, "timeout_s": timeout_s,
               "memory_mb": self.memory_mb if memory_mb is None else int(memory_mb)}
        answer, why = await self._in_a_sandbox(job, language, timeout_s + 11.0)
        if answer is not None and "run" in answer:
            return answer
        return {"sandbox": why}

    async def _in_a_sandbox(self, job: dict[str, Any], language: str,
                            wall: float) -> tuple[dict[str, Any] | None, str]:
        """The runner's answer to ``job`` in a sandbox slot of its own, or (None, why it
        failed: ``timeout:`` and the wall it ran past, or the sandbox's last stderr line)."""
        loop = asyncio.get_running_loop()
        slots = self._slots.get(loop)
        if slots is None:
            slots = self._slots[loop] = asyncio.Queue()
            for slot in range(self.workers):
                slots.put_nowait(slot)
        if language == "cpp":
            await self._precompiled_header(loop)
            wall += COMPILE_WALL_S
        slot = await slots.get()
        try:
            job = {"uid": self.uid_base + slot, "timeout_s": self.timeout_s,
                   "memory_mb": self.memory_mb, "nproc": self.nproc, "language": language,
                   "compiler": self.compiler, "header": str(self.header)
                   if self.header is not None and cxx_header.built(self.header) else "",
                   "isolated": bool(self.prefix), **job}
            return await self._answer(job, wall)
        finally:
            slots.put_nowait(slot)

    async def _precompiled_header(self, loop: asyncio.AbstractEventLoop) -> None:
        """Builds the precompiled ``<bits/stdc++.h>`` if this host has none yet (the first
        C++ program waits for it; the others wait on the lock). A failed build is not tried
        again by this runner."""
        assert self.header is not None
        if self._header_failed or cxx_header.built(self.header):
            return
        lock = self._header_locks.get(loop)
        if lock is None:
            lock = self._header_locks[loop] = asyncio.Lock()
        async with lock:
            if not self._header_failed and not cxx_header.built(self.header):
                self._header_failed = not await cxx_header.build(self.compiler, self.header)

    async def _answer(self, job: dict[str, Any],
                      wall: float) -> tuple[dict[str, Any] | None, str]:
        # (-I: the cases are forked from it, and see the interpreter it is; unsandboxed, the
        # environment they would get from bwrap's --clearenv)
        proc = await asyncio.create_subprocess_exec(
            *self.prefix, sys.executable, "-S", "-I", RUNNER, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=None if self.prefix else {"PATH": "/usr/bin"})
        try:
            # (marshal: the runner reads it without importing json; it is this interpreter)
            out, err = await asyncio.wait_for(proc.communicate(marshal.dumps(job)), wall)
        except TimeoutError:  # (its own wall: the stage's deadline cancels, not this)
            await _killed(proc)
            return None, f"timeout:the sandbox ran past {wall:.0f} s"
        except BaseException:  # the stage's deadline, a cancelled run: the sandbox too
            await _killed(proc)
            raise
        try:
            answer = json.loads(out.decode().strip().splitlines()[-1])
            if isinstance(answer, dict):
                return answer, ""
        except (ValueError, IndexError):
            pass
        why = (err.decode(errors="replace").strip().splitlines() or ["no answer"])[-1][:200]
        log.warning("code_reward: the sandbox failed (exit %s): %s", proc.returncode, why)
        return None, why


async def _killed(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()  # (bwrap: the pid namespace, every process of the program, goes with it)
        await proc.wait()
