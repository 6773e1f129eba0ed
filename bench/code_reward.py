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
(``pivotflow/rl/cxx_header.py``, built on the first program where the cache has none). The last line printed is one JSON object.

    python bench/code_reward.py [--programs 64] [--cases 3] [--workers 2] [--repeats 3]
                                [--language python|cpp]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from pivotflow.rl import cxx_header
from pivotflow.rl.code_reward import CodeRunner, cases_of

RIGHT = "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\n"
WRONG = "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a - b)\n"
# (--language cpp: each program compiled first, with the header competitive programmers use)
CPP = ("#include <bits/stdc++.h>\nint main() {{ long long a, b; std::cin >> a >> b; "
       "std::cout << a {} b << std::endl; }}\n")
PROGRAMS = {"python": (RIGHT, WRONG), "cpp": (CPP.format("+"), CPP.format("-"))}


def tests(n: int) -> dict[str, list[str]]:
    return {"inputs": [f"{i} {i + 1}\n" for i in range(n)],
            "outputs": [f"{2 * i + 1}\n" for i in range(n)]}


async def score(runner: CodeRunner, programs: int, cases: int,
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
    args = ap.parse_args(argv)
    runners = {kind: CodeRunner(workers=args.workers, timeout_s=5.0, memory_mb=512, nproc=64,
                                compiles=args.language == "cpp",
                                isolation=kind) for kind in ("bwrap", "none")}
    rates: dict[str, list[float]] = {k: [] for k in runners}
    for r in range(args.repeats):
        for kind in (("bwrap", "none") if r % 2 == 0 else ("none", "bwrap")):
            rate, passed = asyncio.run(score(runners[kind], args.programs, args.cases,
                                             args.language))
            assert passed == 0.5 or args.programs % 2, passed  # half right, as written
            rates[kind].append(rate)
            print(f"{kind:6s} repeat {r}: {rate:.1f} programs/s", file=sys.stderr)
    median = {k: statistics.median(v) for k, v in rates.items()}
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
               r.header is not None and cxx_header.built(r.header) for r in runners.values())
           else "parsed" if args.language == "cpp" else "",
           "runs": {k: [round(x, 2) for x in v] for k, v in rates.items()}}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
