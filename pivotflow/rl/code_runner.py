"""Runs one program's test cases inside the code reward's sandbox (``code_reward.py``).

Started as ``python -S code_runner.py`` inside bubblewrap, one process per program: it reads
the job (the program, its cases, the limits) as JSON on stdin, runs each case as a process of
its own, and writes one JSON line of outcomes on stdout. Standard library only (it runs with
``-S``, and nothing of pivotflow is imported).

Why a process per case, apart from this one: the program never holds the channel the outcome
goes back on. A case passes only on what this process sees from outside: the program's exit
status, and its stdout compared with the expected output it never saw. As root (bwrap keeps
CAP_SETUID/CAP_SETGID for it) this process stays uid 0 and runs each case as the job's uid
(``CodeRunner``'s: one of its own per sandbox slot, no user's, not the tool sandbox's 65534;
RLIMIT_NPROC counts a uid's processes host-wide, so a program's fork bomb under a shared uid
would fail the cases of every program running beside it), so a
case cannot signal or trace it, nor reach its files in ``/proc``. Without root, both are the
sandbox's one user, and a program written against this runner (one that reaches its parent
through ``/proc``) could write its outcome; unsandboxed (``isolation="none"``), both are the
run's own user.

What an assert-style case cannot prove: the asserts run in the program's own process, so a
program that ends early with status 0 would pass them; each such case therefore also prints a
random token after its asserts, which must come back. That stops a program that merely exits
early; one that looks for the token (its own source file, ``__file__``, or its module's
constants) can still fake a pass, since the token is in the code it runs in. Stdin/stdout and
call cases cannot be faked without the expected output: use them where reward hacking matters.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any

PR_SET_NO_NEW_PRIVS = 38
READ_CAP = 1 << 20  # bytes of a case's stdout and stderr read back; more is "too much output"

# a call case: the program defines the function (or a LeetCode ``class Solution`` method);
# its arguments come on stdin, its return value goes out as JSON
CALL_HARNESS = """
import json as _json, sys as _sys
_args = _json.loads(_sys.stdin.read())
_fn = globals().get({name!r})
if _fn is None and "Solution" in globals():
    _fn = getattr(Solution(), {name!r})
if _fn is None:
    raise NameError("the program defines no function {name}")
print(_json.dumps(_fn(*_args)))
"""


def _limits(job: dict[str, Any]) -> None:
    """In each case's process, before it runs: the limits, then the job's uid where we are
    root."""
    mb = job["memory_mb"]
    cpu = int(job["timeout_s"]) + 1
    for what, value in ((resource.RLIMIT_AS, mb * 2**20), (resource.RLIMIT_CPU, cpu),
                        (resource.RLIMIT_FSIZE, 16 * 2**20), (resource.RLIMIT_NOFILE, 64),
                        (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(what, (value, value))
    if job["isolated"] and os.geteuid() == 0:  # (unsandboxed, it may not reach python)
        resource.setrlimit(resource.RLIMIT_NPROC, (job["nproc"], job["nproc"]))
        os.setgroups([])
        uid = int(job["uid"])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)


def _no_new_privs() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # (a setuid binary gives nothing back)


def _run(job: dict[str, Any], argv: list[str], stdin: str) -> tuple[str, str, str]:
    """One process of the program: (outcome, stdout, last stderr line or why it failed).

    Its input is a file (a pipe it never reads would hold the write). Its session is killed
    whole while the program's own process is still unreaped: a reaped pid may be reused, by
    another process that leads a group of its own, and a kill of that group would reach it
    (unsandboxed, any process of the host)."""
    work = job["work"]
    with open(f"{work}/in", "w") as f:
        f.write(stdin)
    with open(f"{work}/in", "rb") as inp, open(f"{work}/out", "wb") as out, \
            open(f"{work}/err", "wb") as err:
        try:
            proc = subprocess.Popen(argv, stdin=inp, stdout=out, stderr=err,
                                    cwd=work, start_new_session=True,
                                    preexec_fn=lambda: _limits(job), env={"PATH": "/usr/bin"})
        except OSError as exc:
            return "error", "", f"could not start: {exc}"
    pidfd = os.pidfd_open(proc.pid)  # readable once it exits, before anyone reaps it
    try:
        ended = select.select([pidfd], [], [], job["timeout_s"])[0]
        with contextlib.suppress(ProcessLookupError):  # its session: it, and what it left
            os.killpg(proc.pid, signal.SIGKILL)
    finally:
        os.close(pidfd)
    proc.wait()
    if not ended:
        return "timeout", "", ""
    with open(f"{work}/out", "rb") as f:
        stdout = f.read(READ_CAP + 1)
    with open(f"{work}/err", "rb") as f:
        stderr = f.read(READ_CAP).decode(errors="replace").strip().splitlines()
    if len(stdout) > READ_CAP:
        return "output", "", "too much output"
    status = proc.returncode
    if status < 0:  # (waited for: never None)
        why = {int(signal.SIGXCPU): "cpu", int(signal.SIGKILL): "killed"}
        return why.get(-status, "crash"), "", f"signal {-status}"
    last = stderr[-1][:200] if stderr else ""
    if status != 0 and "MemoryError" in last:
        return "memory", "", last
    return ("ok" if status == 0 else "error"), stdout.decode(errors="replace"), last


FLOAT_TOLERANCE = 1e-6  # absolute or relative, as judges accept a real number's digits


def same_output(got: str, want: str) -> bool:
    """Stdout against the expected output as judges compare them: line by line, leading and
    trailing blank lines and each line's trailing spaces left out; a line that differs as text
    still matches token by token (whitespace-separated) where each token is the same text or
    both are real numbers within ``FLOAT_TOLERANCE`` ("0.5" for "0.500000"). Integers compare
    exactly (a float cannot hold every digit of a large one)."""
    got_lines = [line.rstrip() for line in got.strip().splitlines()]
    want_lines = [line.rstrip() for line in want.strip().splitlines()]
    if len(got_lines) != len(want_lines):
        return False
    return all(a == b or _same_tokens(a.split(), b.split())
               for a, b in zip(got_lines, want_lines, strict=True))


def _same_tokens(got: list[str], want: list[str]) -> bool:
    if len(got) != len(want):
        return False
    for a, b in zip(got, want, strict=True):
        if a == b:
            continue
        try:
            if _is_int(a) and _is_int(b):
                if int(a) != int(b):
                    return False
                continue
            x, y = float(a), float(b)
        except ValueError:
            return False
        if not abs(x - y) <= FLOAT_TOLERANCE * max(1.0, abs(y)):  # (a NaN never matches)
            return False
    return True


def _is_int(token: str) -> bool:
    return token.lstrip("+-").isdigit()


def run_case(job: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    py, work = [job["python"], "-S", "-I"], job["work"]
    kind = case["kind"]
    if kind == "stdio":
        outcome, out, why = _run(job, [*py, f"{work}/solution.py"], case["input"])
        if outcome == "ok" and not same_output(out, case["output"]):
            outcome, why = "wrong", "wrong output"
    elif kind == "call":
        with open(f"{work}/call.py", "w") as f:
            f.write(job["code"] + "\n" + CALL_HARNESS.format(name=case["fn_name"]))
        outcome, out, why = _run(job, [*py, f"{work}/call.py"], json.dumps(case["args"]))
        if outcome == "ok":
            try:
                ok = json.loads(out.strip().splitlines()[-1]) == case["output"]
            except (ValueError, IndexError):
                ok = False
            outcome, why = ("ok", "") if ok else ("wrong", "wrong return value")
    else:  # "script": the program, then asserts; the token proves the asserts ran to the end
        token = secrets.token_hex(16)
        with open(f"{work}/script.py", "w") as f:
            f.write(job["code"] + "\n" + case["source"] + f"\nprint({token!r})\n")
        outcome, out, why = _run(job, [*py, f"{work}/script.py"], "")
        if outcome == "ok" and token not in out.split():
            outcome, why = "wrong", "ended before its asserts"
    return {"outcome": outcome, "why": why}


def main() -> None:
    job = json.loads(sys.stdin.read())
    _no_new_privs()
    # the program's files, readable (not writable) by the cases: its own folder, whatever
    # else runs beside it (unsandboxed, the host's /tmp is shared)
    job["work"] = tempfile.mkdtemp(prefix="pivotflow-code-")
    os.chmod(job["work"], 0o755)
    try:
        with open(f"{job['work']}/solution.py", "w") as f:
            f.write(job["code"])
        results: list[dict[str, Any]] = []
        for case in job["cases"]:
            if job["stop_at_failure"] and results and results[-1]["outcome"] != "ok":
                results.append({"outcome": "skipped", "why": ""})
                continue
            results.append(run_case(job, case))
    finally:
        shutil.rmtree(job["work"], ignore_errors=True)
    sys.stdout.write(json.dumps({"cases": results}) + "\n")


if __name__ == "__main__":
    main()
