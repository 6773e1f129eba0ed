"""The code reward's programs run on sandbox servers that speak SandboxFusion's ``/run_code``:
pivotflow's own (``sandbox_server.py``) on other hosts, or a SandboxFusion deployment (what
verl's ``sandbox_fusion`` reward calls).

``RemoteRunner`` has ``CodeRunner``'s ``run``, ``workers`` programs at once. On pivotflow's
server a program and its cases are one request (``/pivotflow/judge``: judged there, in one
sandbox, as the local runner judges; the expected outputs go with it). On a server without that
route (it answers 404: a SandboxFusion deployment) each case is one ``/run_code`` request (the
program with the case's harness, its input as stdin), from then on, and the answers are judged
here exactly as the local runner judges its own runs (``code_runner.outcome_of`` and
``judged``: the expected outputs never leave this process); a C++ program is then compiled by
the server at each case (that protocol has no compiled program to keep). A server that cannot be reached after ``retries`` tries, or answers ``SandboxError``,
gives the case the outcome ``sandbox``: the stage goes on.
"""

from __future__ import annotations

import asyncio
import secrets
import weakref
from collections.abc import AsyncIterator
from typing import Any

from pivotflow.concurrency import closed_at_shutdown
from pivotflow.rl.code_runner import (
    COMPILE_LIMITS,
    case_program,
    judged,
    outcome_of,
    runner_cases,
)
from pivotflow.rl.http_calls import CallFailed, Endpoints, short

RAY = "ray"  # sandbox_url: servers the run starts on its Ray cluster's nodes

OUTCOMES = frozenset({"ok", "wrong", "error", "timeout", "memory", "cpu", "output", "crash",
                      "killed", "skipped", "sandbox", "ran"})


class RemoteRunner:
    """Programs run on the servers at ``urls`` (taken in turn, each request tried ``retries``
    times), ``workers`` at once."""

    def __init__(self, urls: list[str], *, workers: int, timeout_s: float, memory_mb: int,
                 retries: int = 3, token: str = "") -> None:
        for name, value in (("workers", workers), ("timeout_s", timeout_s),
                            ("memory_mb", memory_mb)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"code_reward: {name} must be > 0, got {value!r}")
        self.workers, self.timeout_s, self.memory_mb = int(workers), float(timeout_s), \
            int(memory_mb)
        # "ray": servers the run starts on its cluster's nodes, at the first program, behind
        # a token of its own (ray_sandboxes.py)
        self.on_ray = urls == [RAY]
        token = token or (secrets.token_hex(16) if self.on_ray else "")
        self.token, self.retries = token, retries
        self.endpoints: Endpoints | None = None if self.on_ray else self._endpoints_of(urls)
        self._placing: asyncio.Future[tuple[list[str], list[Any]]] | None = None
        self.ray_actors: list[Any] = []  # (held: an actor no handle holds is gone)
        self._keeper: AsyncIterator[None] | None = None
        self._turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                               asyncio.Semaphore] = weakref.WeakKeyDictionary()
        self.judges = True  # (the servers take /pivotflow/judge, until one answers 404)

    def _endpoints_of(self, urls: list[str]) -> Endpoints:
        # a request waits for its compile and its run, and its turn at the server
        return Endpoints([u.rstrip("/") for u in urls], retries=self.retries,
                         timeout_s=COMPILE_LIMITS["timeout_s"] + self.timeout_s + 60.0,
                         what="code_reward's sandbox server",
                         headers={"Authorization": f"Bearer {self.token}"} if self.token
                         else {})

    async def _servers(self) -> Endpoints:
        """The servers; on "ray", started on the cluster's nodes at the first call (every
        call waits for that one start; a start that failed raises its ValueError at each)."""
        if self.endpoints is not None:
            return self.endpoints
        if self._placing is None:
            from pivotflow.rl.ray_sandboxes import start_on_nodes

            self._placing = asyncio.get_running_loop().run_in_executor(
                None, start_on_nodes, self.memory_mb, self.token)
        urls, actors = await asyncio.shield(self._placing)
        if self.endpoints is None:
            self.endpoints = self._endpoints_of(urls)
            self.ray_actors = actors
            self._keeper = await closed_at_shutdown(self._unplaced)
        return self.endpoints

    async def _unplaced(self) -> None:
        """The servers placed on Ray ended (the run's loop shuts down); a later loop places
        its own."""
        import ray

        for actor in self.ray_actors:
            ray.kill(actor)
        self.ray_actors, self.endpoints, self._placing = [], None, None

    async def run(self, code: str, cases: list[dict[str, Any]], stop_at_failure: bool,
                  language: str = "python", *, timeout_s: float | None = None,
                  defer_stdio: bool = False) -> list[dict[str, Any]]:
        """Each case's outcome, as ``CodeRunner.run`` gives it (``timeout_s``: a case's, over
        the runner's own; ``defer_stdio``: as there)."""
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        cases = runner_cases(cases, language)
        results: list[dict[str, Any]] = []
        async with self._turn():
            if self.judges and language in ("python", "cpp"):  # (pivotflow's server runs those)
                try:
                    return await self._judged_there(code, cases, stop_at_failure, language,
                                                    timeout, defer_stdio)
                except CallFailed as failed:
                    if failed.status != 404:
                        return [{"outcome": "sandbox", "why": short(failed, 200)}
                                for _ in cases]
                    self.judges = False  # (SandboxFusion: a /run_code a case from now on)
            for case in cases:
                if stop_at_failure and results and results[-1]["outcome"] not in ("ok", "ran"):
                    results.append({"outcome": "skipped", "why": ""})
                else:
                    results.append(await self._case(code, case, language, timeout,
                                                    defer_stdio))
        return results

    async def run_raw(self, code: str, stdin: str, language: str = "python", *,
                      timeout_s: float | None = None) -> dict[str, Any]:
        """How ``code`` ran on ``stdin``, unjudged, as ``CodeRunner.run_raw`` answers:
        ``{"run": run}`` (``code_runner.outcome_of``'s form), ``{"compile": first error}``, or
        ``{"sandbox": why}`` where no server ran it (a ``/run_code`` request)."""
        async with self._turn():
            return await self._raw(code, stdin, language,
                                   self.timeout_s if timeout_s is None else float(timeout_s))

    def _turn(self) -> asyncio.Semaphore:
        """This loop's ``workers`` turns (a semaphore belongs to the loop it is first used
        on)."""
        loop = asyncio.get_running_loop()
        turns = self._turns.get(loop)
        if turns is None:
            turns = self._turns[loop] = asyncio.Semaphore(self.workers)
        return turns

    async def _raw(self, code: str, stdin: str, language: str,
                   timeout_s: float) -> dict[str, Any]:
        payload = {"code": code, "language": language, "stdin": stdin,
                   "run_timeout": timeout_s, "compile_timeout": COMPILE_LIMITS["timeout_s"],
                   "memory_limit_MB": self.memory_mb}
        servers = await self._servers()  # (a failed start on Ray is the stage's error)
        try:
            answer = await servers.post(payload, "/run_code")
        except (ConnectionError, ValueError) as why:
            return {"sandbox": short(why, 200)}
        ran = run_of(answer)
        return ran if "sandbox" in ran or "compile" in ran else {"run": ran}

    async def _judged_there(self, code: str, cases: list[dict[str, Any]], stop: bool,
                            language: str, timeout_s: float,
                            defer_stdio: bool) -> list[dict[str, Any]]:
        # (a try waits for every case's timeout and the compile, as the server's sandbox does,
        # and a minute more for its turn there)
        wait = len(cases) * (timeout_s + 1.0) + COMPILE_LIMITS["timeout_s"] + 60.0
        answer = await (await self._servers()).post(
            {"code": code, "language": language, "cases": cases, "stop_at_failure": stop,
             "run_timeout": timeout_s, "memory_limit_MB": self.memory_mb,
             "defer_stdio": defer_stdio}, "/pivotflow/judge", timeout_s=wait)
        results = answer.get("cases") if isinstance(answer, dict) else None
        if not isinstance(results, list) or len(results) != len(cases) or not all(
                isinstance(r, dict) and r.get("outcome") in OUTCOMES for r in results):
            return [{"outcome": "sandbox", "why": "the server's answer is not one outcome a "
                     "case"} for _ in cases]
        return [{"outcome": r["outcome"], "why": short(r.get("why") or "", 200)}
                | ({"stdout": str(r.get("stdout") or "")} if r["outcome"] == "ran" else {})
                for r in results]

    async def _case(self, code: str, case: dict[str, Any], language: str, timeout_s: float,
                    defer_stdio: bool) -> dict[str, Any]:
        source, stdin, token = case_program(code, case)
        raw = await self._raw(code if source is None else source, stdin, language, timeout_s)
        if "sandbox" in raw:
            return {"outcome": "sandbox", "why": raw["sandbox"]}
        if "compile" in raw:
            return {"outcome": "error", "why": f"did not compile: {raw['compile']}"}
        return judged(case, token, *outcome_of(raw["run"]), defer_stdio=defer_stdio)


def run_of(answer: Any) -> dict[str, Any]:
    """A SandboxFusion answer as the runner's own record of a run (``outcome_of`` reads it),
    or ``{"sandbox": why}`` / ``{"compile": first error line}``."""
    if not isinstance(answer, dict) or answer.get("status") not in ("Success", "Failed"):
        why = answer.get("message") if isinstance(answer, dict) else None
        return {"sandbox": short(why or f"an answer that is no run: {short(answer, 80)}", 200)}
    compiled = answer.get("compile_result")
    if isinstance(compiled, dict) and (compiled.get("status") != "Finished"
                                       or compiled.get("return_code") != 0):
        lines = str(compiled.get("stderr") or "").splitlines()
        errors = [line for line in lines if "error" in line] or lines[-1:] or ["no message"]
        return {"compile": short(errors[0], 200)}
    ran = answer.get("run_result")
    if not isinstance(ran, dict):
        return {"sandbox": "the answer has no run_result"}
    if ran.get("status") == "TimeLimitExceeded":  # (what it printed first: the interpreter
        return {"ended": False, "stdout": str(ran.get("stdout") or "")}  # tool shows it)
    code = ran.get("return_code")
    if ran.get("status") != "Finished" or not isinstance(code, int):
        return {"error": short(ran.get("stderr") or ran.get("status"), 200)}
    return {"ended": True, "status": code, "stdout": str(ran.get("stdout") or ""),
            "stderr": str(ran.get("stderr") or ""), "stdout_cut": False}
