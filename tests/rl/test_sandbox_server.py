"""The code sandbox as a service (``rl/sandbox_server.py``, SandboxFusion's ``/run_code``) and
the code reward on it (``rl/sandbox_client.py``): a real server process on loopback judges
every program as the local sandbox does, answers in SandboxFusion's shape, and refuses a
request it cannot run with one line; a server that cannot be reached is the ``sandbox``
outcome, not a failed stage."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from code_checks import SPLIT, split_checker
from script_modules import sandbox_server

from pivotflow.rl.code_reward import CodeRunner, cases_of, code_reward
from pivotflow.rl.sandbox_client import RemoteRunner

pytestmark = pytest.mark.timeout(180)

SUM = {"inputs": ["1 2\n", "3 4\n", "10 -3\n"], "outputs": ["3\n", "7", "7\n"]}
ONE = {"inputs": [""], "outputs": ["done"]}
CALL = {"fn_name": "twice", "inputs": [[2], [5]], "outputs": [4, 10]}
ASSERTS = ["assert twice(2) == 4", "assert twice(3) == 7"]
CPP = ("#include <cstdio>\nint main() { long long a, b; scanf(\"%lld %lld\", &a, &b); "
       "printf(\"%lld\\n\", a + b); }\n")
PROGRAMS: list[tuple[str, Any, str]] = [  # (program, tests, language)
    ("a, b = map(int, input().split())\nprint(a + b)", SUM, "python"),
    ("print(3)", SUM, "python"),  # right once, then wrong
    ("print(", SUM, "python"),  # a syntax error
    ("raise ValueError('no')", SUM, "python"),
    ("while True:\n    pass", ONE, "python"),
    ("x = bytearray(2**30)\nprint('done')", ONE, "python"),
    ("def twice(x):\n    return 2 * x", CALL, "python"),
    ("def twice(x):\n    return 2 * x", ASSERTS, "python"),
    ("import sys\nsys.exit(0)\ndef twice(x): return 0", ASSERTS, "python"),  # leaves early
    (CPP, SUM, "cpp"),
    ("int main() { return x; }", SUM, "cpp"),
    ("int main() { int *p = nullptr; *p = 1; }", ONE, "cpp"),
]


@pytest.fixture(scope="module", params=["pivotflow", "sandboxfusion"])
def protocol(request: pytest.FixtureRequest) -> str:
    """pivotflow's routes, or SandboxFusion's alone (the client then sends a case a request)."""
    return str(request.param)


@pytest.fixture(scope="module")
def server(protocol: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A sandbox server process on a free loopback port; its URL."""
    with sandbox_server(tmp_path_factory.mktemp("cache"), "--memory-mb", "256",
                        "--protocol", protocol) as (url, _):
        yield url


def post(url: str, body: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"{url}/run_code", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def test_a_server_judges_every_program_as_the_local_sandbox_does(
        server: str, protocol: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PIVOTFLOW_CACHE", str(tmp_path / "cache"))
    local = CodeRunner(workers=2, timeout_s=2.0, memory_mb=256, nproc=64, isolation="bwrap",
                       compiles=True)
    remote = RemoteRunner([server], workers=2, timeout_s=2.0, memory_mb=256)

    async def both() -> list[list[str]]:  # (on a SandboxFusion server: a request a case)
        runs = [runner.run(code, cases_of(tests), False, language)
                for runner in (local, remote) for code, tests, language in PROGRAMS]
        return [[r["outcome"] for r in results] for results in await asyncio.gather(*runs)]

    outcomes = asyncio.run(both())
    mine, theirs = outcomes[:len(PROGRAMS)], outcomes[len(PROGRAMS):]
    assert theirs == mine
    assert mine == [["ok"] * 3, ["ok", "wrong", "wrong"], ["error"] * 3, ["error"] * 3,
                    ["timeout"], ["memory"], ["ok", "ok"], ["ok", "error"], ["wrong", "wrong"],
                    ["ok"] * 3, ["error"] * 3, ["crash"]]
    broken = asyncio.run(remote.run("int main() { return x; }", cases_of(SUM), True, "cpp"))
    assert [r["outcome"] for r in broken] == ["error", "skipped", "skipped"]
    assert broken[0]["why"].startswith("did not compile: solution.cpp:1:")
    # pivotflow's server judged a program a request; SandboxFusion's protocol, a case
    assert remote.judges is (protocol == "pivotflow")


def test_code_reward_on_a_server(server: str) -> None:
    remote = code_reward(sandbox_url=server, timeout_s=2.0, language="auto")

    async def score() -> list[float]:
        return list(await asyncio.gather(
            remote("```python\na, b = map(int, input().split())\nprint(a + b)\n```", tests=SUM),
            remote(f"```cpp\n{CPP}```", tests=SUM), remote("print(3)", tests=SUM)))

    assert asyncio.run(score()) == [1.0, 1.0, pytest.approx(1 / 3)]


def test_a_checker_judges_alike_on_a_server(server: str) -> None:
    remote = code_reward(sandbox_url=server, timeout_s=2.0, checker=split_checker)
    strict = code_reward(sandbox_url=server, timeout_s=2.0, checker=split_checker, mode="all")

    async def score() -> list[float]:
        return list(await asyncio.gather(
            remote("n = int(input())\nprint(1, n - 1)", tests=SPLIT),
            remote("print(1, 1)", tests=SPLIT),
            strict("n = int(input())\nprint(2, 3)", tests=SPLIT)))

    assert asyncio.run(score()) == [1.0, 0.0, 0.0]


def test_a_language_only_sandboxfusion_runs_goes_to_run_code(server: str) -> None:
    """Java goes to /run_code a case (pivotflow's server runs python and cpp: it refuses with
    one line, the case's ``sandbox`` outcome)."""
    reward = code_reward(sandbox_url=server, timeout_s=2.0, language="auto", retries=1)
    remote = RemoteRunner([server], workers=1, timeout_s=2.0, memory_mb=256, retries=1)
    got = asyncio.run(remote.run("class Main {}", cases_of(SUM), False, "java"))
    assert [r["outcome"] for r in got] == ["sandbox"] * 3 and remote.judges  # (no judge asked)
    assert "language must be one of python, cpp, got 'java'" in got[0]["why"]
    assert asyncio.run(reward("```java\nclass Main {}\n```", tests=SUM)) == 0.0
    with pytest.raises(ValueError, match=r"^code_reward: java programs run stdin/stdout cases "
                                         r"only; these tests hold script cases$"):
        asyncio.run(remote.run("class Main {}", cases_of(["assert True"]), False, "java"))


def test_its_answers_are_sandboxfusions(server: str) -> None:
    status, answer = post(server, json.dumps({"code": "print(input()[::-1])",
                                              "language": "python", "stdin": "abc"}).encode())
    assert status == 200 and answer["status"] == "Success" and answer["compile_result"] is None
    assert answer["run_result"]["stdout"] == "cba\n" and answer["run_result"]["return_code"] == 0
    assert answer["run_result"]["status"] == "Finished" and answer["files"] == {}
    _, answer = post(server, json.dumps({"code": "int main() { return x; }",
                                         "language": "cpp"}).encode())
    assert answer["status"] == "Failed" and answer["run_result"] is None
    assert "solution.cpp:1:" in answer["compile_result"]["stderr"]
    assert "/tmp/" not in answer["compile_result"]["stderr"]  # (no sandbox path in it)
    _, answer = post(server, json.dumps({"code": "while True: pass",
                                         "run_timeout": 1}).encode())
    assert answer["status"] == "Failed"
    assert answer["run_result"]["status"] == "TimeLimitExceeded"
    assert answer["run_result"]["return_code"] is None
    _, answer = post(server, json.dumps({"code": "import sys\nsys.exit(3)"}).encode())
    assert answer["status"] == "Failed" and answer["run_result"]["return_code"] == 3


@pytest.mark.parametrize(("body", "why"), [
    (b"garbage", "the body is not JSON (Expecting value: line 1 column 1 (char 0))"),
    (b"[1]", "the body must be a JSON object, got list"),
    (b'{"language": "python"}', "code must be a string"),
    (b'{"code": "x", "language": "rust"}', "language must be one of python, cpp, got 'rust'"),
    (b'{"code": "x", "run_timeout": 0}',
     "run_timeout must be a number of seconds in (0, 60], got 0"),
    (b'{"code": "x", "memory_limit_MB": 10000}',
     "memory_limit_MB must be -1 or a whole number in (0, 4096], got 10000"),
    (b'{"code": "x", "files": {"a.txt": "eA=="}}', "files and fetch_files are not served here"),
])
def test_a_request_it_cannot_run_is_a_400_with_one_line(server: str, body: bytes,
                                                         why: str) -> None:
    status, answer = post(server, body)
    assert status == 400
    assert answer == {"status": "SandboxError", "message": why, "compile_result": None,
                      "run_result": None, "files": {}}


@pytest.mark.parametrize(("cases", "why"), [
    ("x", "cases must be a list of at least one case"),
    ([{"kind": "stdio", "input": "1"}], "case 0 is not a stdio, call or script case of "
                                        "code_reward.cases_of's form"),
    ([{"kind": "call", "fn_name": "f", "args": [1], "output": 2}, {"kind": "shell"}],
     "case 1 is not a stdio, call or script case of code_reward.cases_of's form"),
])
def test_a_judge_request_it_cannot_run_is_a_400_with_one_line(server: str, protocol: str,
                                                              cases: Any, why: str) -> None:
    request = urllib.request.Request(
        f"{server}/pivotflow/judge", method="POST", headers={"Content-Type": "application/json"},
        data=json.dumps({"code": "print(1)", "cases": cases}).encode())
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    with refused.value:
        if protocol == "sandboxfusion":  # (no such route there: a client falls back on a 404)
            assert refused.value.code == 404
            return
        assert refused.value.code == 400
        assert json.loads(refused.value.read())["message"] == why


def test_a_server_that_cannot_be_reached_is_the_sandbox_outcome(server: str) -> None:
    remote = RemoteRunner(["http://127.0.0.1:9"], workers=1, timeout_s=2.0, memory_mb=256,
                          retries=1)
    got = asyncio.run(remote.run("print(3)", cases_of(SUM), False))
    assert [r["outcome"] for r in got] == ["sandbox"] * 3
    assert got[0]["why"].startswith("code_reward's sandbox server failed after 1 tries; last: "
                                    "http://127.0.0.1:9/pivotflow/judge: ClientConnectorError")
    reward = code_reward(sandbox_url="http://127.0.0.1:9", retries=1, timeout_s=2.0)
    assert asyncio.run(reward("print(3)", tests=SUM)) == 0.0  # (the stage goes on)
    with pytest.raises(ValueError, match=r"^code_reward's sandbox server: ftp://x is not an "
                                         r"http\(s\):// URL$"):
        code_reward(sandbox_url="ftp://x")
    # a second server on the taken port: one line, status 1
    port = server.rsplit(":", 1)[1]
    taken = subprocess.run([sys.executable, "-m", "pivotflow.rl.sandbox_server", "--port", port],
                           capture_output=True, text=True, timeout=60)
    assert taken.returncode == 1
    assert taken.stderr.strip().splitlines()[-1] == (
        f"sandbox_server: cannot listen on 127.0.0.1:{port}: Address already in use")


def test_a_server_with_a_token_runs_only_the_requests_that_carry_it(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("s3cret-" + "x" * 25 + "\n")
    with sandbox_server(tmp_path / "cache", "--memory-mb", "256",
                        "--token-file", str(secret)) as (url, line):
        assert line.rstrip().endswith("(2 sandboxes, a token)"), line
        with urllib.request.urlopen(f"{url}/v1/ping", timeout=30) as pong:  # (open to all)
            assert pong.read() == b"pong"
        stranger = RemoteRunner([url], workers=1, timeout_s=2.0, memory_mb=256, retries=1)
        got = asyncio.run(stranger.run("print(3)", cases_of(SUM), False))
        assert [r["outcome"] for r in got] == ["sandbox"] * 3
        assert "answered 401" in got[0]["why"] and "needs Authorization" in got[0]["why"]
        reward = code_reward(sandbox_url=url, sandbox_token=secret.read_text().strip(),
                             timeout_s=2.0)
        assert asyncio.run(reward("print(3)", tests=SUM)) == pytest.approx(1 / 3)
    for content, why in (("short\n", "the token in {} is 5 characters; 16 or more, please"),
                         (None, "cannot read --token-file {}: No such file or directory")):
        path = tmp_path / f"t-{content is None}"
        if content is not None:
            path.write_text(content)
        refused = subprocess.run([sys.executable, "-m", "pivotflow.rl.sandbox_server",
                                  "--port", "0", "--token-file", str(path)],
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines()[-1] == f"sandbox_server: {why.format(path)}"
