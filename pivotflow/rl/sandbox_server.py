"""pivotflow's code sandbox as an HTTP service that speaks SandboxFusion's ``/run_code``.

    python -m pivotflow.rl.sandbox_server [--host 127.0.0.1] [--port 8080] [--workers 4]

Code RL runs thousands of programs a step, and a run's controller has a few cores: the
programs belong on other hosts. SandboxFusion (ByteDance's sandbox service, what verl's
``sandbox_fusion`` reward and slime's code rewards call) is the protocol RL users already
deploy; this server answers it with the code reward's own sandbox (``code_sandbox.CodeRunner``:
a bubblewrap sandbox a request, the program as a process forked from a clean interpreter, or
a C++ program compiled with the host's g++), so ``code_reward(..., sandbox_url=...)`` and
verl's ``sandbox_fusion_url`` can use either. ``POST /run_code`` takes ``{"code", "language"
("python" | "cpp"), "stdin", "run_timeout", "memory_limit_MB"}`` (``compile_timeout`` is read
and capped at the runner's 30 s; ``files`` and ``fetch_files`` must be empty) and answers
``{"status": "Success" | "Failed" | "SandboxError", "message", "compile_result",
"run_result", "files": {}}``, each result ``{"status": "Finished" | "TimeLimitExceeded" |
"Error", "execution_time", "return_code", "stdout", "stderr"}`` (a return code below 0 is the
signal that ended the program). A request it cannot read is a 400 with one line saying why.
``GET /v1/ping`` answers ``pong``.

``POST /pivotflow/judge`` is pivotflow's own: a program and all its cases in one request
(``{"code", "language", "cases", "stop_at_failure", "run_timeout", "memory_limit_MB",
"defer_stdio"}``, the
cases in ``code_reward.cases_of``'s form, expected outputs included), judged here in one
sandbox as the local runner judges (``{"cases": [{"outcome", "why"}, ...]}``): a sandbox a
program, not a case. ``sandbox_client.RemoteRunner`` asks it first and falls back to a
``/run_code`` a case on a server without it (a 404: SandboxFusion).

It binds loopback unless ``--host`` says otherwise. SandboxFusion has no authentication; this
server takes a shared secret (``--token-file FILE``, its first line): every request but
``/v1/ping`` must then carry ``Authorization: Bearer <token>`` (``code_reward``'s
``sandbox_token``), else a 401. Without one, anyone who reaches the port may run programs in
its sandboxes.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
from typing import Any

from aiohttp import web

from pivotflow.rl.code_sandbox import CodeRunner

log = logging.getLogger("pivotflow.sandbox_server")

LANGUAGES = ("python", "cpp")
MAX_RUN_TIMEOUT_S = 60.0  # the longest run a request may ask for
DEFAULT_RUN_TIMEOUT_S = 10.0  # SandboxFusion's default
MAX_MEMORY_MB = 4096


class BadRequest(ValueError):
    """A request the server cannot run; the message says why, on one line."""


def run_request(body: Any) -> dict[str, Any]:
    """The run a ``/run_code`` body asks for (``code``, ``stdin``, ``language``,
    ``timeout_s``, ``memory_mb``); BadRequest naming the field otherwise."""
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
    code, stdin = body.get("code"), body.get("stdin") or ""
    if not isinstance(code, str):
        raise BadRequest("code must be a string")
    if not isinstance(stdin, str):
        raise BadRequest("stdin must be a string")
    language = body.get("language", "python")
    if language not in LANGUAGES:
        raise BadRequest(f"language must be one of {', '.join(LANGUAGES)}, got "
                         f"{str(language)[:40]!r}")
    if body.get("files") or body.get("fetch_files"):
        raise BadRequest("files and fetch_files are not served here")
    timeout = body.get("run_timeout", DEFAULT_RUN_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or \
            not 0 < timeout <= MAX_RUN_TIMEOUT_S:
        raise BadRequest(f"run_timeout must be a number of seconds in (0, "
                         f"{MAX_RUN_TIMEOUT_S:g}], got {str(timeout)[:40]}")
    memory = body.get("memory_limit_MB", -1)
    if isinstance(memory, bool) or not isinstance(memory, int) or not (
            memory == -1 or 0 < memory <= MAX_MEMORY_MB):
        raise BadRequest(f"memory_limit_MB must be -1 or a whole number in (0, "
                         f"{MAX_MEMORY_MB}], got {str(memory)[:40]}")
    return {"code": code, "stdin": stdin, "language": language, "timeout_s": float(timeout),
            "memory_mb": None if memory == -1 else memory}


CASE_FIELDS: dict[str, dict[str, type]] = {"stdio": {"input": str, "output": str},
                                           "call": {"fn_name": str, "args": list,
                                                    "output": object},
                                           "script": {"source": str}}


def checked_cases(cases: Any) -> list[dict[str, Any]]:
    """A judge request's cases, each as ``code_reward.cases_of`` makes it; BadRequest naming
    the first that is not."""
    if not isinstance(cases, list) or not cases:
        raise BadRequest("cases must be a list of at least one case")
    for i, case in enumerate(cases):
        fields = CASE_FIELDS.get(str(case.get("kind"))) if isinstance(case, dict) else None
        if fields is None or any(not isinstance(case.get(name), kind) if kind is not object
                                 else name not in case for name, kind in fields.items()):
            raise BadRequest(f"case {i} is not a stdio, call or script case of "
                             "code_reward.cases_of's form")
    return [{"kind": c["kind"], **{name: c[name] for name in CASE_FIELDS[c["kind"]]}}
            for c in cases]


def answer_of(raw: dict[str, Any]) -> dict[str, Any]:
    """SandboxFusion's answer from ``CodeRunner.run_raw``'s."""
    if "sandbox" in raw:
        return {"status": "SandboxError", "message": raw["sandbox"], "compile_result": None,
                "run_result": None, "files": {}}
    compiled, ran = _result(raw.get("compile")), _result(raw.get("run"))
    ok = all(r is None or (r["status"] == "Finished" and r["return_code"] == 0)
             for r in (compiled, ran)) and ran is not None
    return {"status": "Success" if ok else "Failed", "message": "", "compile_result": compiled,
            "run_result": ran, "files": {}}


def _result(ran: dict[str, Any] | None) -> dict[str, Any] | None:
    if ran is None:
        return None
    if "error" in ran:
        return {"status": "Error", "execution_time": 0.0, "return_code": None, "stdout": "",
                "stderr": ran["error"]}
    status = "Finished" if ran["ended"] else "TimeLimitExceeded"
    # (past the runner's cap the output was cut: said in stderr, where a reader looks)
    stderr = ran["stderr"] + ("\n[stdout cut at 1 MiB]" if ran["stdout_cut"] else "")
    return {"status": status, "execution_time": ran["seconds"],
            "return_code": ran["status"] if ran["ended"] else None, "stdout": ran["stdout"],
            "stderr": stderr}


def app(runner: CodeRunner, judges: bool = True, token: str = "",
        max_body_mb: int = 64) -> web.Application:
    """The routes; ``judges`` False: ``/run_code`` and ``/v1/ping`` only, as SandboxFusion
    serves them; ``token``: the secret every run request must carry."""

    @web.middleware
    async def authorized(request: web.Request, handler: Any) -> web.StreamResponse:
        if token and request.path != "/v1/ping":
            given = request.headers.get("Authorization", "").removeprefix("Bearer ")
            if not hmac.compare_digest(given.encode(), token.encode()):
                return _bad("this server needs Authorization: Bearer <its token>", 401)
        response: web.StreamResponse = await handler(request)
        return response

    async def asked_of(request: web.Request) -> tuple[Any, dict[str, Any]]:
        """The body and the run it asks for; BadRequest naming what it cannot run."""
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"the body is not JSON ({str(exc)[:80]})") from None
        asked = run_request({"stdin": "", **body} if isinstance(body, dict) else body)
        if asked["language"] == "cpp" and not runner.compiler:
            raise BadRequest("cpp is not served here: the server has no g++")
        return body, asked

    async def run_code(request: web.Request) -> web.Response:
        try:
            _, asked = await asked_of(request)
        except BadRequest as why:
            return _bad(str(why))
        raw = await runner.run_raw(asked["code"], asked["stdin"], asked["language"],
                                   timeout_s=asked["timeout_s"], memory_mb=asked["memory_mb"])
        return web.json_response(answer_of(raw))

    async def judge(request: web.Request) -> web.Response:
        try:
            body, asked = await asked_of(request)
            results = await runner.run(asked["code"], checked_cases(body.get("cases")),
                                       bool(body.get("stop_at_failure")), asked["language"],
                                       timeout_s=asked["timeout_s"],
                                       memory_mb=asked["memory_mb"],
                                       defer_stdio=bool(body.get("defer_stdio")))
        except ValueError as why:  # (BadRequest, and CodeRunner.run's own refusals)
            return _bad(str(why))
        return web.json_response({"cases": results})

    async def ping(_: web.Request) -> web.Response:
        return web.Response(text="pong")

    # (a judge request carries a program's cases, expected outputs included: some datasets'
    # run to megabytes; a body past the cap is aiohttp's 413)
    application = web.Application(client_max_size=max_body_mb * 2**20,
                                  middlewares=[authorized])
    application.add_routes([web.post("/run_code", run_code), web.get("/v1/ping", ping)])
    if judges:
        application.add_routes([web.post("/pivotflow/judge", judge)])
    return application


def _bad(why: str, status: int = 400) -> web.Response:
    return web.json_response({"status": "SandboxError", "message": why, "compile_result": None,
                              "run_result": None, "files": {}}, status=status)


async def listening(host: str, port: int, runner: CodeRunner, judges: bool = True,
                    token: str = "", max_body_mb: int = 64) -> tuple[web.AppRunner, str]:
    """The server, serving on this loop (``cleanup()`` the runner to stop it), and the URL it
    listens on (``port`` 0: a free one); raises OSError where it cannot listen."""
    site_runner = web.AppRunner(app(runner, judges, token, max_body_mb), access_log=None)
    await site_runner.setup()
    site = web.TCPSite(site_runner, host, port, backlog=1024)
    try:
        await site.start()
    except OSError:
        await site_runner.cleanup()
        raise
    bound = site_runner.addresses[0]
    return site_runner, f"http://{bound[0]}:{bound[1]}"


async def serve(host: str, port: int, runner: CodeRunner, judges: bool = True,
                token: str = "", max_body_mb: int = 64) -> None:
    site_runner, url = await listening(host, port, runner, judges, token, max_body_mb)
    print(f"sandbox_server: listening on {url} "
          f"({runner.workers} sandboxes{', a token' if token else ', no token'})", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await site_runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080, help="0: any free port (printed)")
    ap.add_argument("--workers", type=int, default=4, help="programs at once")
    ap.add_argument("--memory-mb", type=int, default=512,
                    help="a program's address space when a request says -1")
    ap.add_argument("--isolation", choices=("bwrap", "none"), default="bwrap")
    ap.add_argument("--max-body-mb", type=int, default=64,
                    help="the largest request body taken (a judge request's cases)")
    ap.add_argument("--token-file", default="",
                    help="a file whose first line is the secret requests must carry")
    ap.add_argument("--protocol", choices=("pivotflow", "sandboxfusion"), default="pivotflow",
                    help="sandboxfusion: /run_code only, as SandboxFusion serves (a client's "
                         "check against that protocol alone)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        runner = server_runner(args.workers, args.memory_mb, args.isolation)
    except ValueError as why:
        raise SystemExit(f"sandbox_server: {why}") from None
    if args.max_body_mb < 1:
        raise SystemExit(f"sandbox_server: --max-body-mb must be >= 1, got {args.max_body_mb}")
    if not 0 <= args.port < 65536:
        raise SystemExit(f"sandbox_server: --port must be in [0, 65535], got {args.port}")
    token = _token(args.token_file) if args.token_file else ""
    try:
        asyncio.run(serve(args.host, args.port, runner, args.protocol == "pivotflow", token,
                          args.max_body_mb))
    except KeyboardInterrupt:
        pass
    except OSError as exc:  # (the port taken, an address not this host's)
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise SystemExit(f"sandbox_server: cannot listen on {args.host}:{args.port}: "
                         f"{reason}") from None


def _token(path: str) -> str:
    try:
        with open(path) as f:
            token = f.readline().strip()
    except OSError as exc:
        raise SystemExit(f"sandbox_server: cannot read --token-file {path}: "
                         f"{exc.strerror or exc}") from None
    if len(token) < 16:
        raise SystemExit(f"sandbox_server: the token in {path} is {len(token)} characters; "
                         "16 or more, please")
    return token


def server_runner(workers: int, memory_mb: int, isolation: str) -> CodeRunner:
    """The sandboxes a server runs its requests in (this command's, and a Ray node's:
    ``ray_sandboxes.py``): C++ as well where the host has g++. Raises ValueError (one line)
    where they cannot be (no bubblewrap, a bad number)."""
    import shutil

    return CodeRunner(workers=workers, timeout_s=DEFAULT_RUN_TIMEOUT_S, memory_mb=memory_mb,
                      nproc=64, isolation=isolation, compiles=shutil.which("g++") is not None)


if __name__ == "__main__":
    main()
