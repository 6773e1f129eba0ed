"""Rewards from running the policy's programs against test cases, in a sandbox.

``code_reward(tests="tests")`` is an ``async def`` map stage function: it takes the program out
of ``completion`` (the last fenced code block, else the whole text), runs it against the
sample's ``tests`` field and writes the share of cases passed as ``reward`` (``mode="all"``:
1.0 only if every case passes, as DeepCoder and verl's ``prime_code`` score), while the run
goes on (an awaited stage: ``Graph.map``'s ``concurrency``).

The cases, as code datasets carry them (a JSON string of them is read too):

* stdin/stdout, APPS/TACO/CodeContests/DeepCoder: ``{"inputs": [...], "outputs": [...]}``;
  a case passes when the program exits 0 and its stdout is the expected output, line by
  line, trailing spaces left out, real numbers within 1e-6 (``code_runner.same_output``);
* a function call, LeetCode style: ``{"fn_name": "f", "inputs": [[args], ...], "outputs":
  [...]}``; the function (or ``class Solution``'s method) called with the arguments must
  return the output (compared as JSON values);
* asserts, MBPP/HumanEval: a list of test sources (``["assert f(1) == 2", ...]``, each a
  case) or one source (one case): the program, then the asserts, must run to their end.

Each program runs in a bubblewrap sandbox of its own (``tools/bwrap.py``: no network, a
read-only system, a private size-capped ``/tmp``, its own pid namespace), under
``code_runner.py``, which runs each case as a process of its own with a uid of its slot's and limits on
memory, CPU time, open files and file size, and kills it at ``timeout_s``. What it trusts and
what a program can fake: ``code_runner``'s docstring. Each program's share of cases by outcome is
averaged per step into ``logged_metrics``: ``code_ok``, ``code_wrong`` (ran, wrong answer),
``code_error`` (raised, or exited non-zero), ``code_timeout``, ``code_other`` (out of memory
or CPU time, too much output, killed by a signal, or the sandbox itself failed).

Without bubblewrap, ``code_reward`` refuses unless ``isolation="none"`` (a warning: programs
then run as the run's own user, with this host's filesystem and network; only the limits and
the timeout hold).
"""

from __future__ import annotations

import asyncio
import json
import logging
import marshal
import random
import re
import shutil
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pivotflow.controller.user_metrics import log_metric, recording_now
from pivotflow.rl import cxx_header
from pivotflow.tools import bwrap

log = logging.getLogger("pivotflow.code_reward")

RUNNER = str(Path(__file__).with_name("code_runner.py"))
# the uids the cases run as (as root): a block of `workers` drawn from here, held by no user
UID_FIRST, UID_LAST = 1_000_000, 2_000_000_000
MODES = ("fraction", "all")
LANGUAGES = ("python", "cpp", "auto")
COMPILE_WALL_S = 31.0  # a C++ compile's time limit in the sandbox (code_runner's), and its exit
# what each case's outcome is logged as (logged_metrics' code_ok, code_wrong, ...): the rare
# ones (cpu, memory, output, crash, killed, the sandbox's own failure) as "other"
LOGGED = ("ok", "wrong", "error", "timeout", "other")
OUTCOME_GROUP = {"ok": "ok", "wrong": "wrong", "error": "error", "timeout": "timeout"}
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)


# a fenced block's tag for each language (an unmarked block is Python's)
FENCE_TAGS = {"python": ("python", "py", "python3", ""), "cpp": ("cpp", "c++", "cc", "cxx")}


def code_of(completion: str, language: str = "python") -> str:
    """The program in a completion: its last fenced block marked ``language`` (Python's: or
    unmarked), else its last fenced block, else what follows a fence left open (a response
    cut at its max_tokens), else the whole text."""
    blocks = _FENCE.findall(completion)
    tags = FENCE_TAGS[language]
    marked = [code for lang, code in blocks if lang.lower() in tags]
    if marked:
        return marked[-1]
    if blocks:
        return blocks[-1][1]
    opened = completion.rfind("```")
    return completion if opened < 0 else completion[opened:].partition("\n")[2]


def language_of(completion: str) -> str:
    """``language="auto"``'s choice: C++ when the completion's last fenced block is marked as
    C++ (``cpp``, ``c++``, ``cc``, ``cxx``), else Python."""
    blocks = _FENCE.findall(completion)
    tag = blocks[-1][0].lower() if blocks else ""
    if not blocks:  # (a fence left open: its tag)
        opened = completion.rfind("```")
        tag = completion[opened + 3:].partition("\n")[0].strip().lower() if opened >= 0 else ""
    return "cpp" if tag in FENCE_TAGS["cpp"] else "python"


def cases_of(tests: Any) -> list[dict[str, Any]]:
    """A sample's test cases in the runner's form; ValueError naming what is wrong."""
    if isinstance(tests, str) and tests.lstrip().startswith(("{", "[")):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError as exc:
            raise ValueError(f"code_reward: the tests are not JSON ({exc})") from None
    if isinstance(tests, str):
        return [{"kind": "script", "source": tests}]
    if isinstance(tests, list | tuple):
        if not tests or not all(isinstance(t, str) for t in tests):
            raise ValueError("code_reward: a list of tests must hold test sources (strings), "
                             "at least one")
        return [{"kind": "script", "source": t} for t in tests]
    if not isinstance(tests, dict) or "inputs" not in tests or "outputs" not in tests:
        raise ValueError(f"code_reward: tests of type {type(tests).__name__} are none of "
                         "{inputs, outputs}, {fn_name, inputs, outputs}, a list of asserts")
    inputs, outputs = list(tests["inputs"]), list(tests["outputs"])
    if len(inputs) != len(outputs) or not inputs:
        raise ValueError(f"code_reward: {len(inputs)} inputs and {len(outputs)} outputs; one "
                         "output per input, at least one")
    name = tests.get("fn_name")
    if name:
        return [{"kind": "call", "fn_name": str(name), "args": list(a)
                 if isinstance(a, list | tuple) else [a], "output": o}
                for a, o in zip(inputs, outputs, strict=True)]
    return [{"kind": "stdio", "input": _text(i), "output": _text(o)}
            for i, o in zip(inputs, outputs, strict=True)]


def _text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


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
        self.compiler = shutil.which("g++") or "" if compiles else ""
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
                  language: str = "python") -> list[dict[str, Any]]:
        """Each case's outcome (``{"outcome": "ok" | ..., "why": ...}``); a sandbox that
        breaks gives every case the outcome ``sandbox``. ``language`` "cpp": the program is
        compiled first (stdin/stdout cases only; a runner built with ``compiles``)."""
        if language == "cpp":
            if not self.compiler:
                raise ValueError("code_reward: this runner was not built for C++ programs")
            if any(case["kind"] != "stdio" for case in cases):
                kinds = sorted({case["kind"] for case in cases} - {"stdio"})
                raise ValueError(f"code_reward: C++ programs run stdin/stdout cases only; "
                                 f"these tests hold {', '.join(kinds)} cases")
        loop = asyncio.get_running_loop()
        slots = self._slots.get(loop)
        if slots is None:
            slots = self._slots[loop] = asyncio.Queue()
            for slot in range(self.workers):
                slots.put_nowait(slot)
        if language == "cpp":
            await self._precompiled_header(loop)
        slot = await slots.get()
        try:
            return await self._run(code, cases, stop_at_failure, slot, language)
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

    async def _run(self, code: str, cases: list[dict[str, Any]], stop_at_failure: bool,
                   slot: int, language: str) -> list[dict[str, Any]]:
        # (a call case's arguments as JSON, its program's stdin: the runner imports no json)
        cases = [{**case, "input": json.dumps(case["args"])} if case["kind"] == "call" else case
                 for case in cases]
        job = {"uid": self.uid_base + slot, "code": code, "cases": cases,
               "timeout_s": self.timeout_s, "memory_mb": self.memory_mb, "nproc": self.nproc,
               "stop_at_failure": stop_at_failure, "language": language,
               "compiler": self.compiler, "header": str(self.header)
               if self.header is not None and cxx_header.built(self.header) else "",
               "isolated": bool(self.prefix)}
        # each case's timeout, its start-up, and the sandbox's own
        wall = len(cases) * (self.timeout_s + 1.0) + 10.0 + (
            COMPILE_WALL_S if language == "cpp" else 0.0)
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
            return [{"outcome": "timeout", "why": f"the sandbox ran past {wall:.0f} s"}
                    for _ in cases]
        except BaseException:  # the stage's deadline, a cancelled run: the sandbox too
            await _killed(proc)
            raise
        try:
            results = json.loads(out.decode().strip().splitlines()[-1])["cases"]
            if len(results) == len(cases):
                return list(results)
        except (ValueError, IndexError, KeyError, TypeError):
            pass
        why = (err.decode(errors="replace").strip().splitlines() or ["no answer"])[-1][:200]
        log.warning("code_reward: the sandbox failed (exit %s): %s", proc.returncode, why)
        return [{"outcome": "sandbox", "why": why} for _ in cases]


async def _killed(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()  # (bwrap: the pid namespace, every process of the program, goes with it)
        await proc.wait()


def code_reward(tests: str = "tests", *, mode: str = "fraction", workers: int = 2,
                timeout_s: float = 5.0, memory_mb: int = 512, nproc: int = 64,
                isolation: str = "bwrap", language: str = "python",
                extract: Callable[[str], str] | None = None) -> Callable[..., Any]:
    """An ``async def`` map stage function: ``completion`` and the ``tests`` field in,
    ``reward`` out (the share of cases passed; ``mode="all"``: 1.0 only if all pass, and the
    cases after a failure are not run). ``workers``: programs run at once (each a sandbox
    and, inside, one case at a time); ``timeout_s``, ``memory_mb``: each case's wall time
    and address space; ``nproc``: processes and threads of a slot's uid
    together (a fork bomb's ceiling); ``language``: "python", "cpp" (compiled with g++
    ``-std=c++17 -O2`` in the sandbox, stdin/stdout cases only) or "auto" (C++ where the
    completion's last fenced block is marked so, else Python: ``language_of``);
    ``extract``: the program from the completion (default: its last block of the language,
    ``code_of``).

    Give the stage ``concurrency=workers``: a call out waits for a sandbox inside itself, on
    its stage's ``deadline_s``, where a call over the stage's concurrency waits its turn
    without it.

    Raises ValueError (one line) for a bad argument, or when bubblewrap cannot run and
    ``isolation`` is not "none"."""
    if mode not in MODES:
        raise ValueError(f"code_reward: mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not isinstance(tests, str) or not tests.isidentifier():
        raise ValueError(f"code_reward: tests must name a field, got {tests!r}")
    if language not in LANGUAGES:
        raise ValueError(f"code_reward: language must be one of {', '.join(LANGUAGES)}, got "
                         f"{language!r}")
    runner = CodeRunner(workers=workers, timeout_s=timeout_s, memory_mb=memory_mb,
                        nproc=nproc, isolation=isolation, compiles=language != "python")

    async def reward(completion: str, **fields: Any) -> float:
        cases = cases_of(fields[tests])
        chosen = language_of(completion) if language == "auto" else language
        code = extract(completion) if extract is not None else code_of(completion, chosen)
        results = await runner.run(code, cases, stop_at_failure=mode == "all", language=chosen)
        passed = sum(r["outcome"] == "ok" for r in results)
        ran = [r["outcome"] for r in results if r["outcome"] != "skipped"]
        for name in LOGGED if recording_now() else ():
            # each program's share of its cases by outcome, averaged per step
            share = sum(OUTCOME_GROUP.get(o, "other") == name for o in ran) / len(ran)
            log_metric(f"code_{name}", share)
        if mode == "all":
            return 1.0 if passed == len(cases) else 0.0
        return passed / len(cases)

    reward.__signature__ = _signature(tests)  # type: ignore[attr-defined]
    reward.__name__ = reward.__qualname__ = "code_reward"
    return reward


def _signature(tests: str) -> Any:
    """``(completion, <tests>)``: the fields the stage reads, as the graph checks them."""
    import inspect

    keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Signature([inspect.Parameter("completion", keyword),
                              inspect.Parameter(tests, keyword)])
