"""Rewards from running programs against test cases in a bubblewrap sandbox
(``rl/code_reward.py``, ``rl/code_runner.py``): the three case formats code datasets carry, the
outcomes a judge tells apart, the limits a hostile program meets, and what it cannot fake."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from code_checks import SPLIT, split_checker

from pivotflow.controller.user_metrics import UserMetrics, recording
from pivotflow.rl.code_reward import (
    CodeRunner,
    cases_of,
    code_of,
    code_reward,
    language_of,
    time_limit_of,
)

pytestmark = pytest.mark.timeout(120)

SUM = {"inputs": ["1 2\n", "3 4\n", "10 -3\n"], "outputs": ["3\n", "7", "7\n"]}
ADD = "a, b = map(int, input().split())\nprint(a + b)\n"


@pytest.fixture(scope="module")
def runner() -> CodeRunner:
    return CodeRunner(workers=2, timeout_s=2.0, memory_mb=256, nproc=64, isolation="bwrap")


def outcomes(runner: CodeRunner, code: str, tests: Any, stop: bool = False) -> list[str]:
    return [r["outcome"] for r in asyncio.run(runner.run(code, cases_of(tests), stop))]


def test_the_program_is_the_last_python_block_else_the_last_block_else_the_text() -> None:
    text = "Plan:\n```text\nnot code\n```\n```python\nx = 1\n```\nthen\n```py\nx = 2\n```\n"
    assert code_of(text) == "x = 2\n"
    assert code_of("```text\nonly this\n```") == "only this\n"
    assert code_of("print(1)") == "print(1)"
    assert code_of("Here:\n```python\nx = 1\nprint(x") == "x = 1\nprint(x"  # (cut off)


def test_the_case_formats_code_datasets_carry() -> None:
    assert cases_of(SUM)[1] == {"kind": "stdio", "input": "3 4\n", "output": "7"}
    assert cases_of(json.dumps(SUM)) == cases_of(SUM)  # (verl's and TACO's JSON strings)
    assert cases_of({"inputs": [["1", "2"]], "outputs": [["3"]]})[0]["input"] == "1\n2"
    call = cases_of({"fn_name": "f", "inputs": [[1, 2], 5], "outputs": [3, 5]})
    assert call == [{"kind": "call", "fn_name": "f", "args": [1, 2], "output": 3},
                    {"kind": "call", "fn_name": "f", "args": [5], "output": 5}]
    assert cases_of(["assert f(1) == 2", "assert f(2) == 3"])[1] == {
        "kind": "script", "source": "assert f(2) == 3"}
    assert cases_of("def check(f): ...\ncheck(f)") == [{"kind": "script",
                                                       "source": "def check(f): ...\ncheck(f)"}]


@pytest.mark.parametrize(("tests", "error"), [
    ({"inputs": ["1"], "outputs": []}, r"^code_reward: 1 inputs and 0 outputs; one output per "
                                       r"input, at least one$"),
    ({"input": ["1"]}, r"^code_reward: tests of type dict are none of"),
    ([], r"^code_reward: a list of tests must hold test sources \(strings\), at least one$"),
    ('{"inputs": [1', r"^code_reward: the tests are not JSON \("),
    (3, r"^code_reward: tests of type int are none of"),
])
def test_tests_it_cannot_read_are_one_line_errors(tests: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        cases_of(tests)


@pytest.mark.parametrize(("got", "want", "same"), [
    ("3\n", "3", True), ("1 2 \n\n", "\n1 2\n", True), ("1  2", "1 2", True),
    ("0.5", "0.500000", True), ("3.0000001", "3", True), ("1e-7", "0", True),
    ("1000000.5", "1000000.4", True), ("0.51", "0.5", False), ("3", "3.5", False),
    ("12345678901234567891", "12345678901234567890", False),  # (integers: exactly)
    ("nan", "nan", True), ("nan", "0.5", False), ("yes", "YES", False),
    ("1\n2", "1 2", False), ("1 2 3", "1 2", False),
])
def test_stdout_is_compared_as_judges_compare_it(got: str, want: str, same: bool) -> None:
    from pivotflow.rl.code_runner import same_output

    assert same_output(got, want) is same


def test_stdin_stdout_cases_pass_on_the_expected_output(runner: CodeRunner) -> None:
    assert outcomes(runner, ADD, SUM) == ["ok", "ok", "ok"]  # (trailing newlines aside)
    assert outcomes(runner, "print(3)", SUM) == ["ok", "wrong", "wrong"]
    assert outcomes(runner, "print(3)\nraise SystemExit(2)", SUM)[0] == "error"
    assert outcomes(runner, "print(", SUM)[0] == "error"  # (a syntax error)
    # mode "all": the cases after the first failure are not run
    assert outcomes(runner, "print(3)", SUM, stop=True) == ["ok", "wrong", "skipped"]


def test_call_cases_compare_the_return_value(runner: CodeRunner) -> None:
    tests = {"fn_name": "twoSum", "inputs": [[[2, 7, 11], 9], [[1, 3], 4]],
             "outputs": [[0, 1], [0, 1]]}
    leetcode = ("class Solution:\n    def twoSum(self, nums, target):\n"
                "        seen = {}\n        for i, n in enumerate(nums):\n"
                "            if target - n in seen:\n                return [seen[target - n], i]\n"
                "            seen[n] = i\n")
    assert outcomes(runner, leetcode, tests) == ["ok", "ok"]
    assert outcomes(runner, "def twoSum(nums, target):\n    return [1, 0]", tests) == [
        "wrong", "wrong"]
    assert outcomes(runner, "x = 1", tests) == ["error", "error"]  # (no such function)


def test_assert_cases_must_run_to_their_end(runner: CodeRunner) -> None:
    tests = ["assert double(2) == 4", "assert double(3) == 7"]
    assert outcomes(runner, "def double(x):\n    return 2 * x\n", tests) == ["ok", "error"]
    # a program that leaves with status 0 before the asserts passes nothing
    for leave in ("import sys\nsys.exit(0)", "import os\nos._exit(0)", "raise SystemExit"):
        assert outcomes(runner, leave + "\ndef double(x): return 0", tests) == [
            "wrong", "wrong"], leave


def test_a_case_runs_as_a_fresh_interpreter_runs_a_script(runner: CodeRunner) -> None:
    """Each case is forked from the runner's case forker and run as ``__main__``: exit
    statuses, tracebacks, threads, atexit and the rest as ``python -S -I`` gives them."""
    one = {"inputs": [""], "outputs": ["done"]}

    def results(code: str) -> list[dict[str, Any]]:
        return list(asyncio.run(runner.run(code, cases_of(one), False)))

    assert results("raise ValueError('boom')") == [{"outcome": "error",
                                                    "why": "ValueError: boom"}]
    assert results("import sys\nprint('done')\nsys.exit('bad')") == [
        {"outcome": "error", "why": "bad"}]  # (a message: printed, status 1)
    assert results("print('done')\nraise SystemExit(256)")[0]["outcome"] == "ok"  # (0, as 256)
    for code in (
        "if __name__ == '__main__':\n    print('done')",
        "import atexit\natexit.register(print, 'done')",  # (run at the end)
        "import threading, time\n"  # (a non-daemon thread is waited for)
        "threading.Thread(target=lambda: (time.sleep(0.2), print('done'))).start()",
        # no `from __future__ import annotations` of the runner's reaches the program
        "def f(x: int): pass\nprint('done' if f.__annotations__['x'] is int else 'str')",
        # nothing open but its own stdin, stdout and stderr (and the listing's own)
        "import os\nprint('done' if sorted(map(int, os.listdir('/proc/self/fd'))) == "
        "[0, 1, 2, 3] else os.listdir('/proc/self/fd'))",
        "import sys\nprint('done' if sys.flags.isolated and sys.flags.no_site and "
        "sys.argv[0].endswith('solution.py') else sys.flags)",
    ):
        assert results(code) == [{"outcome": "ok", "why": ""}], code


def test_the_expected_output_is_nowhere_in_the_programs_memory(runner: CodeRunner) -> None:
    """The case forker is forked before the runner reads the job: a program that reads its
    whole address space finds no expected output (it finds its own input, which it has)."""
    scan = ("import ctypes, re, sys\n"
            "ctypes.CDLL(None).prctl(4, 1)  # (dumpable again after the uid drop: /proc/self/mem)\n"
            "given = sys.stdin.read()  # (kept)\n"
            "head, tail = ('zeb' + 'ra-').encode(), str(31336 + 1).encode()\n"
            "found = False\n"
            "with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as mem:\n"
            "    for line in maps:\n"
            "        span, perms = line.split()[:2]\n"
            "        lo, hi = (int(x, 16) for x in span.split('-'))\n"
            "        if 'r' not in perms or '[v' in line:\n"
            "            continue\n"
            "        try:\n"
            "            mem.seek(lo)\n"
            "            data = mem.read(hi - lo)\n"
            "        except (OSError, OverflowError, ValueError):\n"
            "            continue\n"
            "        at = data.find(head)\n"
            "        while at >= 0 and not found:\n"
            "            found = data[at + len(head): at + len(head) + len(tail)] == tail\n"
            "            at = data.find(head, at + 1)\n"
            "print(head.decode() + tail.decode() if found else 'absent')\n")
    hidden = {"inputs": ["1 2"], "outputs": ["zebra-31337"]}
    assert outcomes(runner, scan, hidden) == ["wrong"]  # (it printed "absent")
    given = {"inputs": ["zebra-31337"], "outputs": ["zebra-31337"]}
    assert outcomes(runner, scan, given) == ["ok"]  # the scan finds what is there


CPP_ADD = ("#include <cstdio>\nint main() { long long a, b; scanf(\"%lld %lld\", &a, &b); "
           "printf(\"%lld\\n\", a + b); }\n")


@pytest.fixture(scope="module")
def cpp_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache of the module's own: its C++ runners build their precompiled header there."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def cpp_runner(cpp_cache: Path) -> CodeRunner:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIVOTFLOW_CACHE", str(cpp_cache))
        return CodeRunner(workers=2, timeout_s=2.0, memory_mb=256, nproc=64,
                          isolation="bwrap", compiles=True)


def test_cpp_programs_are_compiled_once_and_run_on_each_case(cpp_runner: CodeRunner) -> None:
    def run(code: str, stop: bool = False, tests: Any = SUM) -> list[dict[str, Any]]:
        return list(asyncio.run(cpp_runner.run(code, cases_of(tests), stop, "cpp")))

    assert [r["outcome"] for r in run(CPP_ADD)] == ["ok", "ok", "ok"]
    assert [r["outcome"] for r in run("#include <cstdio>\nint main() { puts(\"3\"); }")] == [
        "ok", "wrong", "wrong"]
    broken = run("int main() { return x; }")
    assert [r["outcome"] for r in broken] == ["error"] * 3
    assert broken[0]["why"].startswith("did not compile: solution.cpp:1:")
    assert "error: 'x' was not declared" in broken[0]["why"]
    assert [r["outcome"] for r in run("int main() { return x; }", stop=True)] == [
        "error", "skipped", "skipped"]
    one = {"inputs": [""], "outputs": ["done"]}
    assert [r["outcome"] for r in run("int main() { volatile int x = 0; while (1) x++; }",
                                      tests=one)] == ["timeout"]
    hungry = ("#include <vector>\n#include <cstdio>\nint main() { std::vector<char> "
              "v(1ull << 31); v[5] = 1; printf(\"%d\", v[5]); }")
    assert [r["outcome"] for r in run(hungry, tests=one)] == ["memory"]  # (std::bad_alloc)
    assert run("int main() { int *p = nullptr; *p = 1; }", tests=one) == [
        {"outcome": "crash", "why": "signal 11"}]
    if os.geteuid() == 0:  # the program runs as its slot's uid, not as root
        uids = range(cpp_runner.uid_base, cpp_runner.uid_base + cpp_runner.workers)
        mine = ("#include <cstdio>\n#include <unistd.h>\nint main() { unsigned u = getuid(); "
                f"puts(u >= {uids.start}u && u < {uids.stop}u ? \"done\" : \"root\"); }}")
        assert [r["outcome"] for r in run(mine, tests=one)] == ["ok"]


def test_bits_stdcpp_is_precompiled_once_and_a_damaged_one_is_passed_over(
        cpp_runner: CodeRunner, cpp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pivotflow.rl import cxx_header

    whole = ("#include <bits/stdc++.h>\nint main() { long long a, b; std::cin >> a >> b; "
             "std::cout << a + b << std::endl; }\n")
    assert cpp_runner.header is not None and cpp_runner.header.parent == cpp_cache
    outcomes = [r["outcome"] for r in asyncio.run(cpp_runner.run(whole, cases_of(SUM), False,
                                                                 "cpp"))]
    assert outcomes == ["ok", "ok", "ok"] and cxx_header.built(cpp_runner.header)
    # a header that is not a precompiled one (g++ checks and reads the real one instead)
    damaged = cpp_cache / "damaged"
    monkeypatch.setenv("PIVOTFLOW_CACHE", str(damaged))
    runner = CodeRunner(workers=1, timeout_s=2.0, memory_mb=256, nproc=64, isolation="bwrap",
                        compiles=True)
    assert runner.header is not None
    (runner.header / "bits").mkdir(parents=True)
    (runner.header / "bits" / "stdc++.h.gch").write_bytes(b"not a header" * 100)
    outcomes = [r["outcome"] for r in asyncio.run(runner.run(whole, cases_of(SUM), False,
                                                             "cpp"))]
    assert outcomes == ["ok", "ok", "ok"]


def test_cpp_is_chosen_by_the_completions_fence(cpp_cache: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIVOTFLOW_CACHE", str(cpp_cache))
    text = "First:\n```python\nprint(1)\n```\nIn C++:\n```cpp\nint main() {}\n```\n"
    assert language_of(text) == "cpp" and code_of(text, "cpp") == "int main() {}\n"
    assert code_of(text) == "print(1)\n"  # (Python's block, for a Python reward)
    assert language_of("```c++\nint main() {\n") == "cpp"  # (a fence left open)
    assert language_of("```\nprint(1)\n```") == language_of("print(1)") == "python"
    java = "```java\nclass Main {}\n```"  # (a language only a SandboxFusion deployment runs)
    assert language_of(java) == "python"  # (here: python or cpp)
    assert language_of(java, ("python", "cpp", "java")) == "java"
    auto = code_reward(language="auto", timeout_s=2.0)

    async def score() -> list[float]:
        return list(await asyncio.gather(auto(f"```cpp\n{CPP_ADD}```", tests=SUM),
                                         auto(f"```python\n{ADD}```", tests=SUM),
                                         auto(f"```c++\n{ADD}```", tests=SUM)))

    assert asyncio.run(score()) == [1.0, 1.0, 0.0]  # (Python code in a C++ fence: compiled)


def test_cpp_refusals_are_one_line(cpp_runner: CodeRunner, monkeypatch: pytest.MonkeyPatch,
                                   tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^code_reward: C\+\+ programs run stdin/stdout cases "
                                         r"only; these tests hold script cases$"):
        asyncio.run(cpp_runner.run(CPP_ADD, cases_of(["assert True"]), False, "cpp"))
    with pytest.raises(ValueError, match=r"^code_reward: language must be one of python, cpp, "
                                         r"auto \(or, on a SandboxFusion deployment, java, go, "
                                         r".*\), got 'cobol'$"):
        code_reward(language="cobol")
    with pytest.raises(ValueError, match=r"^code_reward: language 'rust' runs on a "
                                         r"SandboxFusion deployment only \(sandbox_url=\.\.\.\); "
                                         r"this host's sandbox runs python and cpp$"):
        code_reward(language="rust")
    monkeypatch.setenv("PATH", str(tmp_path))  # (a host without g++)
    with pytest.raises(ValueError, match=r"^code_reward: C\+\+ programs need g\+\+, which is "
                                         r"not on PATH; install it"):
        code_reward(language="cpp")


@pytest.mark.parametrize(("tests", "limit"), [
    ({"inputs": [""], "outputs": [""], "time_limit": 2}, 2.0),
    ({"inputs": [""], "outputs": [""], "time_limit": {"seconds": 1, "nanos": 500000000}}, 1.5),
    (json.dumps({"inputs": [""], "outputs": [""], "time_limit": "2 seconds"}), 2.0),
    ({"inputs": [""], "outputs": [""], "time_limit": "1.5s"}, 1.5),
    ({"inputs": [""], "outputs": [""]}, None), (["assert True"], None),
])
def test_a_problems_own_time_limit_is_read(tests: Any, limit: float | None) -> None:
    assert time_limit_of(tests) == limit


def test_a_problems_own_time_limit_holds_where_it_is_the_lower() -> None:
    reward = code_reward(timeout_s=2.0)
    slow = "import time\ntime.sleep(1.3)\nprint('done')"

    def tests(limit: Any) -> dict[str, Any]:
        return {"inputs": [""], "outputs": ["done"], "time_limit": limit}

    async def score() -> list[float]:
        return list(await asyncio.gather(reward(slow, tests=tests(1)),
                                         reward(slow, tests=tests(30))))  # (held at 2 s)

    assert asyncio.run(score()) == [0.0, 1.0]
    for bad in ("fast", 0, -1):
        with pytest.raises(ValueError, match=r"^code_reward: the tests' time_limit .* is not a "
                                             r"number of seconds > 0$"):
            time_limit_of(tests(bad))


def test_a_checker_judges_outputs_with_more_than_one_right_answer() -> None:
    other = "n = int(input())\nprint(1, n - 1)"  # (right, but not the recorded answer)
    plain, checked = code_reward(timeout_s=2.0), code_reward(timeout_s=2.0, checker=split_checker)
    strict = code_reward(timeout_s=2.0, checker=split_checker, mode="all")

    async def score() -> list[float]:
        return list(await asyncio.gather(
            plain(other, tests=SPLIT), checked(other, tests=SPLIT),
            checked("print(1, 1)", tests=SPLIT),  # (a sum the checker refuses)
            checked("raise ValueError", tests=SPLIT),  # (an error: no checker call)
            strict("n = int(input())\nprint(2, 3)", tests=SPLIT),  # (right on the first only)
            checked(ADD, tests=SUM)))  # (exact answers pass the checker's way too? no: below)

    got = asyncio.run(score())
    assert got[:5] == [0.0, 1.0, 0.0, 0.0, 0.0]
    assert got[5] == 0.0  # (SUM's outputs are not splits: the checker, not the text, decides)
    calls: list[tuple[str, str, str]] = []

    def recording_checker(given: str, output: str, expected: str) -> bool:
        calls.append((given, output, expected))
        raise RuntimeError("the checker broke")

    broken = code_reward(timeout_s=2.0, checker=recording_checker)
    with pytest.raises(RuntimeError, match="the checker broke"):  # (the stage's error)
        asyncio.run(broken(other, tests=SPLIT))
    assert calls == [("5\n", "1 4\n", "2 3\n")]
    with pytest.raises(ValueError, match=r"^code_reward: checker must be a function \(input, "
                                         r"output, expected\) -> bool, got str$"):
        code_reward(checker="exact")  # type: ignore[arg-type]


def test_a_hostile_program_meets_the_sandbox_and_the_limits(runner: CodeRunner,
                                                            tmp_path: Path) -> None:
    one = {"inputs": [""], "outputs": ["done"]}
    t = time.monotonic()
    assert outcomes(runner, "while True:\n    pass", one) == ["timeout"]
    assert time.monotonic() - t < 15  # (timeout_s 2)
    assert outcomes(runner, "x = bytearray(2**30)\nprint('done')", one) == ["memory"]
    assert outcomes(runner, "while True:\n    print('x' * 4096)", one)[0] in (
        "timeout", "output", "error")  # (the 16 MB file size limit, else the clock)
    net = ("import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=1)\n"
           "except OSError:\n    print('done')")
    assert outcomes(runner, net, one) == ["ok"]  # no network at all
    secret = tmp_path / "secret.txt"  # (the host's /tmp, where a run's files could be)
    secret.write_text("key")
    look = f"import os\nprint('done' if not os.path.exists({str(secret)!r}) else 'seen')"
    assert outcomes(runner, look, one) == ["ok"]  # the host's files are not there
    if os.geteuid() == 0:  # (bwrap as root: each case drops to its slot's own uid)
        uids = range(runner.uid_base, runner.uid_base + runner.workers)
        assert outcomes(runner, f"import os\nprint('done' if os.getuid() in {list(uids)} "
                                "else 0)", one) == ["ok"]
    bomb = "import os\nwhile True:\n    os.fork()"
    t = time.monotonic()

    async def bomb_beside_a_program() -> list[list[dict[str, Any]]]:
        return list(await asyncio.gather(runner.run(bomb, cases_of(one), False),
                                         runner.run(ADD, cases_of(SUM), False)))

    bombed, beside = asyncio.run(bomb_beside_a_program())
    assert bombed[0]["outcome"] in ("error", "timeout")
    assert time.monotonic() - t < 15
    # the program in the other slot never felt it (its uid's process budget is its own)
    assert [r["outcome"] for r in beside] == ["ok", "ok", "ok"]
    assert outcomes(runner, ADD, SUM) == ["ok", "ok", "ok"]  # and the next program is served


def test_the_reward_is_the_share_passed_or_all_and_each_outcome_is_logged() -> None:
    fraction = code_reward(timeout_s=2.0)
    strict = code_reward("cases", mode="all", timeout_s=2.0)
    metrics = UserMetrics()

    async def score() -> list[float]:
        return list(await asyncio.gather(
            fraction(f"```python\n{ADD}```", tests=SUM),
            fraction("print(3)", tests=SUM),
            strict("print(3)", cases=SUM),
            strict(ADD, cases=json.dumps(SUM))))

    with recording(metrics):
        got = asyncio.run(score())
    assert got == [1.0, pytest.approx(1 / 3), 0.0, 1.0]
    logged = metrics.drain()  # each program's shares, averaged over the four (skips aside)
    assert logged == pytest.approx({"code_ok": (1 + 1 / 3 + 1 / 2 + 1) / 4,
                                    "code_wrong": (2 / 3 + 1 / 2) / 4, "code_error": 0.0,
                                    "code_timeout": 0.0, "code_other": 0.0})
    from pivotflow.graph import fn_reads

    assert fn_reads(strict, "here", "reward") == {"completion", "cases"}


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"mode": "any"}, r"^code_reward: mode must be one of fraction, all, got 'any'$"),
    ({"tests": "my tests"}, r"^code_reward: tests must name a field, got 'my tests'$"),
    ({"timeout_s": 0}, r"^code_reward: timeout_s must be > 0, got 0$"),
    ({"isolation": "docker"}, r"^code_reward: isolation must be bwrap or none, got 'docker'$"),
])
def test_bad_arguments_are_one_line_errors(kwargs: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        code_reward(**kwargs)


def test_without_bubblewrap_it_refuses_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    from pivotflow.tools import bwrap

    monkeypatch.setattr(bwrap, "executable", lambda: None)  # (a host without bwrap)
    with pytest.raises(ValueError, match=r"^code_reward: bubblewrap \(bwrap\) is not "
                                         r"installed; install bubblewrap, or pass "
                                         r"isolation='none' to run programs unsandboxed$"):
        code_reward()
    unsandboxed = code_reward(isolation="none", timeout_s=2.0)
    assert asyncio.run(unsandboxed(ADD, tests=SUM)) == 1.0




def test_what_a_program_leaves_running_is_killed_with_its_case(tmp_path: Path) -> None:
    """A case's session is killed when its program ends: a process it left running does not
    outlive the case (unsandboxed here, to see its pid from the host)."""
    marker = tmp_path / "child.pid"
    leaves = (f"import os, time\nif os.fork() == 0:\n    open({str(marker)!r}, 'w')"
              ".write(str(os.getpid()))\n    time.sleep(30)\nelse:\n    time.sleep(0.5)\n"
              "    print('done')")
    runner = CodeRunner(workers=1, timeout_s=5.0, memory_mb=256, nproc=64, isolation="none")
    assert outcomes(runner, leaves, {"inputs": [""], "outputs": ["done"]}) == ["ok"]
    status = Path(f"/proc/{int(marker.read_text())}/status")

    def gone() -> bool:  # (or a zombie its orphaned parent's reaper has not collected yet)
        try:
            return "zombie" in status.read_text()
        except FileNotFoundError:
            return True

    deadline = time.monotonic() + 5
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone()


@pytest.mark.timeout(30)  # (the first fence pattern: ~5 s at 30k fences, quadratic)
def test_a_degenerate_completion_is_read_without_scanning_for_ever() -> None:
    """A policy may write fences without end; the controller reads each completion on its
    loop, so finding the blocks must stay linear in the text."""
    # (no block closes in any: a fence left open gives what follows its line)
    for text, code in (("```" * 200_000, ""), ("```python" + " " * 500_000, ""),
                       ("```\n" + "x" * 500_000, "x" * 500_000)):
        assert code_of(text) == code and language_of(text) == "python"
    assert code_of("```cpp\nint main() {}\n```\nthen ```python\nprint(1)\n```", "cpp") == \
        "int main() {}\n"
