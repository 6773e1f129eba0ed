"""Runs one program's test cases inside the code reward's sandbox (``code_reward.py``).

Started as ``python -S -I code_runner.py`` inside bubblewrap, one process per program: it
reads the job (the program, its cases, the limits) as JSON on stdin, runs each case as a process
of its own, and writes one JSON line of outcomes on stdout. Standard library only (it runs with
``-S -I``, and nothing of pivotflow is imported).

Each case's process is forked, not started: before it reads the job, the runner forks a case
forker (``case_forker.py``: a clean interpreter that never holds the job), and each case is a
child of that forker running the program as ``__main__`` (that module says how, and what
differs from a fresh ``python -S -I``).

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

# Only what the interpreter has loaded or builds in: this process starts once a program, and
# json, secrets, tempfile, shutil, typing and the like cost 15-20 ms of imports a start, more
# than the cases of a short test list (``bench/code_reward.py``). json is imported for call
# cases only.
import _signal
import marshal
import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from pivotflow.rl import case_forker


def _sibling(name: str) -> Any:
    """A module of this folder, by its path (``-I`` leaves this folder off ``sys.path``, and
    so off the programs' too)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    module = type(sys)(name)
    module.__file__ = path
    with open(path, "rb") as f:
        exec(compile(f.read(), path, "exec", dont_inherit=True), module.__dict__)
    return module


if not TYPE_CHECKING:
    case_forker = _sibling("case_forker")

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


def _no_new_privs() -> None:
    """No setuid binary gives a case anything back (bwrap has set it already: then no ctypes,
    a few milliseconds of import, is needed)."""
    with open("/proc/self/status") as f:
        if "NoNewPrivs:\t1" in f.read():
            return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def _execute(job: dict[str, Any], forker: case_forker.CaseForker, program: dict[str, Any],
             stdin: str, limits: dict[str, Any] | None = None) -> dict[str, Any]:
    """One process of the program (``program``: ``{"script": path}``, a Python file run as
    ``__main__``, or ``{"argv": [...]}``, an executable), ``stdin`` its input, a file (a pipe
    it never reads would hold the write); ``limits`` over the job's own. How it ended, as
    ``outcome_of`` reads it: ``ended`` (before its timeout), ``status`` (its exit code, or
    -signal), ``stdout`` and ``stderr`` (their first ``READ_CAP`` bytes), ``stdout_cut``,
    ``seconds``; or ``{"error": why}`` when it could not start."""
    work = job["work"]
    with open(f"{work}/in", "w") as f:
        f.write(stdin)
    for name in ("out", "err"):  # (empty, ours: the case writes through what it opens)
        open(f"{work}/{name}", "wb").close()
    started = time.perf_counter()
    reply = forker.run({**program, **{k: job[k] for k in case_forker.CASE_KEYS},
                        **(limits or {})})
    seconds = time.perf_counter() - started
    if "error" in reply:
        return {"error": str(reply["error"])}
    with open(f"{work}/out", "rb") as f:
        stdout = f.read(READ_CAP + 1)
    with open(f"{work}/err", "rb") as f:
        stderr = f.read(READ_CAP)
    return {"ended": bool(reply["ended"]), "status": int(reply["status"]),
            "stdout": stdout[:READ_CAP].decode(errors="replace"),
            "stdout_cut": len(stdout) > READ_CAP, "stderr": stderr.decode(errors="replace"),
            "seconds": round(seconds, 6)}


def outcome_of(ran: dict[str, Any]) -> tuple[str, str, str]:
    """(outcome, stdout, last stderr line or why it failed) of one run of a program: this
    runner's (``_execute``) or a sandbox server's, in that form (``sandbox_client.py``)."""
    if "error" in ran:
        return "error", "", str(ran["error"])
    if not ran["ended"]:
        return "timeout", "", ""
    if ran["stdout_cut"]:
        return "output", "", "too much output"
    stderr = ran["stderr"].strip().splitlines()
    status = int(ran["status"])
    last = stderr[-1][:200] if stderr else ""
    if status < 0:
        why = {_signal.SIGXCPU: "cpu", _signal.SIGKILL: "killed"}
        if any("std::bad_alloc" in line for line in stderr):  # (C++'s new, past RLIMIT_AS)
            return "memory", "", last
        return why.get(-status, "crash"), "", f"signal {-status}"
    if status != 0 and "MemoryError" in last:
        return "memory", "", last
    return ("ok" if status == 0 else "error"), ran["stdout"], last


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


def runner_cases(cases: list[dict[str, Any]], language: str) -> list[dict[str, Any]]:
    """``cases_of``'s cases as a runner takes them, local or remote: a call case's arguments
    as JSON, its program's stdin (the runner imports no json). ValueError (one line) for a
    case a language other than Python cannot run (its harnesses are Python)."""
    if language != "python" and any(case["kind"] != "stdio" for case in cases):
        kinds = sorted({case["kind"] for case in cases} - {"stdio"})
        name = "C++" if language == "cpp" else language
        raise ValueError(f"code_reward: {name} programs run stdin/stdout cases only; these "
                         f"tests hold {', '.join(kinds)} cases")
    import json  # (on the controller's side only)

    return [{**case, "input": json.dumps(case["args"])} if case["kind"] == "call" else case
            for case in cases]


def case_program(code: str, case: dict[str, Any]) -> tuple[str | None, str, str]:
    """What one case runs: (the program's source with the case's harness, or None for the
    program alone; its stdin; for an assert case, the token its output must hold, else "")."""
    if case["kind"] == "stdio":
        return None, case["input"], ""
    if case["kind"] == "call":  # (its arguments as JSON: code_reward writes them)
        return code + "\n" + CALL_HARNESS.format(name=case["fn_name"]), case["input"], ""
    # "script": the program, then asserts; the token proves the asserts ran to the end
    token = os.urandom(16).hex()
    return code + "\n" + case["source"] + f"\nprint({token!r})\n", "", token


def judged(case: dict[str, Any], token: str, outcome: str, out: str, why: str,
           defer_stdio: bool = False) -> dict[str, Any]:
    """A case's result from how its program ran: a run that exited 0 is ``ok`` only if its
    output is the expected one (stdout; the call's return value as JSON; the assert
    script's token). ``defer_stdio``: a stdin/stdout case that exited 0 is ``ran``, with its
    stdout, for a checker on the controller (``code_reward(checker=...)``) to judge."""
    if outcome == "ok":
        if case["kind"] == "stdio" and defer_stdio:
            return {"outcome": "ran", "why": "", "stdout": out}
        if case["kind"] == "stdio" and not same_output(out, case["output"]):
            outcome, why = "wrong", "wrong output"
        elif case["kind"] == "call":
            import json  # (the program's output: parsed as JSON, never as anything richer)

            try:
                ok = json.loads(out.strip().splitlines()[-1]) == case["output"]
            except (ValueError, IndexError):
                ok = False
            outcome, why = ("ok", "") if ok else ("wrong", "wrong return value")
        elif case["kind"] == "script" and token not in out.split():
            outcome, why = "wrong", "ended before its asserts"
    return {"outcome": outcome, "why": why}


def run_case(job: dict[str, Any], forker: case_forker.CaseForker, case: dict[str, Any]) -> dict[str, Any]:
    source, stdin, token = case_program(job["code"], case)
    program = job["program"]
    if source is not None:
        path = f"{job['work']}/{case['kind']}.py"
        with open(path, "w") as f:
            f.write(source)
        program = {"script": path}
    return judged(case, token, *outcome_of(_execute(job, forker, program, stdin)),
                  defer_stdio=bool(job.get("defer_stdio")))


def _python(job: dict[str, Any]) -> None:
    with open(f"{job['work']}/solution.py", "w") as f:
        f.write(job["code"])
    job["program"] = {"script": f"{job['work']}/solution.py"}


# g++ as judges run it (Codeforces: -O2, C++17); its own limits: a compiler needs far more
# memory than the program it builds (cc1plus with <bits/stdc++.h>: ~250 MB)
CXX_FLAGS = ("-std=c++17", "-O2", "-pipe")
COMPILE_LIMITS = {"timeout_s": 30.0, "memory_mb": 2048}


def _compiled(job: dict[str, Any], forker: case_forker.CaseForker) -> dict[str, Any] | None:
    """Compiles the C++ program as the cases' uid (the compiler reads what the program
    includes: as root it could include what root alone may read), into a folder of that uid's
    that becomes root's once built (no case can change the binary the next runs). None when
    it built, else every case's result (an ``error``, the compiler's first error line)."""
    work, uid = job["work"], int(job["uid"])
    build = f"{work}/build"
    os.mkdir(build, 0o755)
    as_root = job["isolated"] and os.geteuid() == 0
    if as_root:
        os.chown(build, uid, uid)
    with open(f"{work}/solution.cpp", "w") as f:
        f.write(job["code"])
    binary = f"{build}/program"
    # (the precompiled <bits/stdc++.h>'s folder first: cxx_header.py)
    header = ["-I", job["header"], "-Winvalid-pch"] if job["header"] else []
    ran = _execute(job, forker, {"argv": [job["compiler"], *CXX_FLAGS, *header, "-o", binary,
                                          f"{work}/solution.cpp"]}, "", COMPILE_LIMITS)
    if "stderr" in ran:  # (the compiler's messages name the file as the program's writer did)
        ran["stderr"] = ran["stderr"].replace(f"{work}/", "")
    job["compiled"] = ran  # (a raw run's answer holds it)
    outcome, _, why = outcome_of(ran)
    if as_root:
        for path in (build, binary):
            if os.path.exists(path):
                os.chown(path, 0, 0)
    if outcome != "ok" or not os.path.exists(binary):
        with open(f"{work}/err", errors="replace") as f:
            errors = [line for line in f.read(READ_CAP).splitlines() if "error" in line]
        why = (errors[0] if errors else why or outcome).replace(f"{work}/", "")[:200]
        return {"outcome": "error", "why": f"did not compile: {why}"}
    job["program"] = {"argv": [binary]}
    return None


def main() -> None:
    _no_new_privs()
    forker = case_forker.CaseForker()  # before the job is read: it never holds the expected outputs
    job = marshal.loads(sys.stdin.buffer.read())  # (code_reward's, on this interpreter)
    if any(case["kind"] == "call" for case in job["cases"]):
        forker.preload("json")  # (the call harness's: imported once, not a case at a time)
    # the program's files, readable (not writable) by the cases: its own folder, whatever
    # else runs beside it (unsandboxed, the host's /tmp is shared)
    job["work"] = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                               f"pivotflow-code-{os.urandom(8).hex()}")
    os.mkdir(job["work"], 0o700)
    os.chmod(job["work"], 0o755)
    try:
        failed = None
        if job["language"] == "cpp":
            failed = _compiled(job, forker)
        else:
            _python(job)
        if job.get("raw"):  # one input, how the program ran (a sandbox server's answer)
            ran = None if failed else _execute(job, forker, job["program"], job["stdin"])
            if ran is not None and "stderr" in ran:  # (a traceback names solution.py alone)
                ran["stderr"] = ran["stderr"].replace(f"{job['work']}/", "")
            answer: dict[str, Any] = {"compile": job.get("compiled"), "run": ran}
        else:
            results: list[dict[str, Any]] = []
            for case in job["cases"]:
                # (a case a checker judges later ran to its end: the next ones run too)
                if job["stop_at_failure"] and results and \
                        results[-1]["outcome"] not in ("ok", "ran"):
                    results.append({"outcome": "skipped", "why": ""})
                else:  # (a program that did not compile fails each case it would have run)
                    results.append(failed or run_case(job, forker, case))
            answer = {"cases": results}
    finally:
        forker.close()
        if not job["isolated"]:  # (in the sandbox /tmp is its own, gone with it)
            import shutil

            shutil.rmtree(job["work"], ignore_errors=True)
    sys.stdout.write(_json(answer) + "\n")


def _json(value: Any) -> str:
    """``value`` (dicts, lists, strings, numbers, booleans, None) as JSON: the answer's only
    types (json itself is not imported)."""
    if isinstance(value, str):
        return '"' + "".join(c if c >= " " and c not in '"\\' and not "\ud800" <= c <= "\udfff"
                             else f"\\u{ord(c):04x}" for c in value) + '"'
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_json(str(k))}: {_json(v)}" for k, v in value.items()) + "}"
    return "[" + ", ".join(_json(v) for v in value) + "]"


if __name__ == "__main__":
    main()
