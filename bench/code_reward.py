"""What the code reward's sandbox costs: programs scored a second in bubblewrap against the same
programs run unsandboxed, on the same cases, in one sitting.

Each program is a stdin/stdout solution (half right, half wrong: a wrong answer runs as long)
scored on ``--cases`` cases, ``--workers`` programs at once, as ``code_reward`` runs them in a
run's reward stage. Variants, alternated ``--repeats`` times (the order reversed each time):

* ``bwrap``: ``isolation="bwrap"``, the default: a sandbox a program, each case a process;
* ``none``: ``isolation="none"``: the same runner and case processes, no sandbox.

Beside them: each case is a process forked from the runner's case forker
(``pivotflow/rl/case_forker.py``; ``case_processes``: "forked"; before 12-06's change each was a
``python -S -I`` started afresh): ``case_fork_ms`` is one such fork, reaped (in a bare
``python -S -I``), ``case_start_ms`` one fresh start-up, what a case paid before. ``none`` is
no bound on ``bwrap`` since then: unsandboxed, the runner also imports ctypes (bubblewrap has
set no_new_privs already) and shutil (the sandbox's ``/tmp`` needs no cleaning), ~5 ms a
program that the sandbox's start about matches. ``--language cpp``: the programs are C++
(``<bits/stdc++.h>``, as competitive programmers write them), each compiled in its sandbox
before its cases run; ``cxx_header`` says whether the compiles read that header precompiled
(``pivotflow/rl/cxx_header.py``, built on the first program where the cache has none).
``--server [pivotflow|sandboxfusion]``: a third variant, ``server``, the same programs on
``python -m pivotflow.rl.sandbox_server`` on loopback with as many sandboxes
(``code_reward``'s ``sandbox_url``): pivotflow's protocol, a program a request judged in one
sandbox there, or SandboxFusion's alone (``--protocol sandboxfusion``), a request and a
sandbox a case, judged here. The last line printed is one JSON object.

    python bench/code_reward.py [--programs 64] [--cases 3] [--workers 2] [--repeats 3]
                                [--language python|cpp]
                                [--server [pivotflow|sandboxfusion]]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from pivotflow.rl import cxx_header
from pivotflow.rl.code_reward import CodeRunner, cases_of
from pivotflow.rl.sandbox_client import RemoteRunner

RIGHT = "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\n"
WRONG = "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a - b)\n"
# (--language cpp: each program compiled first, with the header competitive programmers use)
CPP = ("#include <bits/stdc++.h>\nint main() {{ long long a, b; std::cin >> a >> b; "
       "std::cout << a {} b << std::endl; }}\n")
PROGRAMS = {"python": (RIGHT, WRONG), "cpp": (CPP.format("+"), CPP.format("-"))}


def tests(n: int) -> dict[str, list[str]]:
    return {"inputs": [f"{i} {i + 1}\n" for i in range(n)],
            "outputs": [f"{2 * i + 1}\n" for i in range(n)]}


async def score(runner: CodeRunner | RemoteRunner, programs: int, cases: int,
                language: str = "python") -> tuple[float, float]:
    """(programs a second, share of cases passed)."""
    parsed = cases_of(tests(cases))
    t = time.perf_counter()
    right, wrong = PROGRAMS[language]
    results = await asyncio.gather(*(runner.run(right if i % 2 == 0 else wrong, parsed, False,
                                                language)
                                     for i in range(programs)))
    seconds = time.perf_counter() - t
    passed = sum(r["outcome"] == "ok" for rs in results for r in rs)
    return programs / seconds, passed / (programs * cases)


def case_start_ms(repeats: int = 20) -> float:
    t = time.perf_counter()
    for _ in range(repeats):
        subprocess.run([sys.executable, "-S", "-I", "-c", "pass"], check=True)
    return (time.perf_counter() - t) / repeats * 1e3


def case_fork_ms(repeats: int = 50) -> float:
    forks = ("import os, time\nt = time.perf_counter()\n"
             f"for _ in range({repeats}):\n"
             "    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n    os.waitpid(pid, 0)\n"
             f"print((time.perf_counter() - t) / {repeats} * 1e3)")
    out = subprocess.run([sys.executable, "-S", "-I", "-c", forks], check=True,
                         capture_output=True, text=True).stdout
    return float(out)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=64)
    ap.add_argument("--cases", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--language", choices=sorted(PROGRAMS), default="python")
    ap.add_argument("--server", nargs="?", const="pivotflow", default="",
                    choices=("pivotflow", "sandboxfusion"),
                    help="a third variant: the programs on a sandbox server on loopback, "
                         "speaking pivotflow's protocol (a program a request) or "
                         "SandboxFusion's alone (a case a request)")
    args = ap.parse_args(argv)
    runners: dict[str, CodeRunner | RemoteRunner] = {
        kind: CodeRunner(workers=args.workers, timeout_s=5.0, memory_mb=512, nproc=64,
                         compiles=args.language == "cpp", isolation=kind)
        for kind in ("bwrap", "none")}
    with contextlib.ExitStack() as stack:
        if args.server:
            url = stack.enter_context(sandbox_server(args.workers, args.server))
            runners["server"] = RemoteRunner([url], workers=args.workers, timeout_s=5.0,
                                             memory_mb=512)
        rates = measure(runners, args)
    median = {k: statistics.median(v) for k, v in rates.items()}
    local = [r for r in runners.values() if isinstance(r, CodeRunner)]
    out = {"bench": "code_reward", "date": datetime.date.today().isoformat(),
           "programs": args.programs, "cases": args.cases, "language": args.language,
           "workers": args.workers,
           "repeats": args.repeats,
           "sandboxed_programs_per_s": round(median["bwrap"], 2),
           "unsandboxed_programs_per_s": round(median["none"], 2),
           "sandboxed_over_unsandboxed": round(median["bwrap"] / median["none"], 3),
           "sandboxed_cases_per_s": round(median["bwrap"] * args.cases, 2),
           "case_start_ms": round(case_start_ms(), 2),
           "case_fork_ms": round(case_fork_ms(), 3), "case_processes": "forked",
           "cxx_header": "precompiled" if any(
               r.header is not None and cxx_header.built(r.header) for r in local)
           else "parsed" if args.language == "cpp" else "",
           "runs": {k: [round(x, 2) for x in v] for k, v in rates.items()}}
    if args.server:
        out["server_protocol"] = args.server
        out["server_programs_per_s"] = round(median["server"], 2)
        out["server_over_sandboxed"] = round(median["server"] / median["bwrap"], 3)
    print(json.dumps(out))
    return out


def measure(runners: dict[str, Any], args: argparse.Namespace) -> dict[str, list[float]]:
    """Each variant's programs a second, ``--repeats`` times, the order reversed each time."""
    rates: dict[str, list[float]] = {k: [] for k in runners}
    for r in range(args.repeats):
        for kind in (list(runners) if r % 2 == 0 else list(runners)[::-1]):
            rate, passed = asyncio.run(score(runners[kind], args.programs, args.cases,
                                             args.language))
            assert passed == 0.5 or args.programs % 2, passed  # half right, as written
            rates[kind].append(rate)
            print(f"{kind:6s} repeat {r}: {rate:.1f} programs/s", file=sys.stderr)
    return rates


@contextlib.contextmanager
def sandbox_server(workers: int, protocol: str) -> Iterator[str]:
    """``python -m pivotflow.rl.sandbox_server`` on a free loopback port; its URL."""
    proc = subprocess.Popen([sys.executable, "-m", "pivotflow.rl.sandbox_server", "--port", "0",
                             "--workers", str(workers), "--memory-mb", "512",
                             "--protocol", protocol],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on " not in line:
            raise SystemExit(f"code_reward bench: the sandbox server did not start ({line!r})")
        yield line.split("listening on ")[1].split()[0]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)  # (reaped, its pipe read and closed)


if __name__ == "__main__":
    main()
