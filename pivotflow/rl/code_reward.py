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
the timeout hold). C++ (``language="cpp"`` or ``"auto"``) is compiled in the sandbox first.
The local sandboxes are ``code_sandbox.CodeRunner``; with ``sandbox_url`` the programs run on
sandbox servers instead (``sandbox_client.RemoteRunner``, SandboxFusion's protocol), judged
here the same way.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any

from pivotflow.controller.user_metrics import log_metric, recording_now
from pivotflow.rl.code_sandbox import CodeRunner
from pivotflow.rl.sandbox_client import RemoteRunner
from pivotflow.stage_options import reads_fields

log = logging.getLogger("pivotflow.code_reward")

MODES = ("fraction", "all")
LANGUAGES = ("python", "cpp", "auto")
# what each case's outcome is logged as (logged_metrics' code_ok, code_wrong, ...): the rare
# ones (cpu, memory, output, crash, killed, the sandbox's own failure) as "other"
LOGGED = ("ok", "wrong", "error", "timeout", "other")
OUTCOME_GROUP = {"ok": "ok", "wrong": "wrong", "error": "error", "timeout": "timeout"}
_FENCE_TAG = re.compile(r"[ \t]*([\w+-]*)")


# a fenced block's tag for each language (an unmarked block is Python's)
FENCE_TAGS = {"python": ("python", "py", "python3", ""), "cpp": ("cpp", "c++", "cc", "cxx"),
              # run on a SandboxFusion deployment only (its names; sandbox_url=...)
              "java": ("java",), "go": ("go", "golang"), "rust": ("rust", "rs"),
              "nodejs": ("javascript", "js", "node", "nodejs"),
              "typescript": ("typescript", "ts"), "csharp": ("csharp", "cs", "c#"),
              "kotlin_script": ("kotlin", "kt"), "ruby": ("ruby", "rb"), "php": ("php",),
              "bash": ("bash", "sh", "shell"), "lua": ("lua",), "scala": ("scala",)}
LOCAL_LANGUAGES = ("python", "cpp")  # what this host's sandbox (and pivotflow's server) runs


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """Each complete fenced block's (tag, code), in order: a ```` ``` ```` and its tag, the rest
    of that line, the code up to the next ```` ``` ````. In one pass over the text (a regex
    scanning each fence's line to its end took quadratic time, 5 s on the controller's loop, on
    a response of 30k fences with no newline, as a degenerate policy may write)."""
    blocks: list[tuple[str, str]] = []
    pos = 0
    while True:
        start = text.find("```", pos)
        line_end = text.find("\n", start) if start >= 0 else -1
        end = text.find("```", line_end + 1) if line_end >= 0 else -1
        if end < 0:  # (no newline after it, or no fence to close it: none after either)
            return blocks
        tag = _FENCE_TAG.match(text, start + 3, line_end)
        blocks.append((tag.group(1) if tag else "", text[line_end + 1:end]))
        pos = end + 3


def code_of(completion: str, language: str = "python") -> str:
    """The program in a completion: its last fenced block marked ``language`` (Python's: or
    unmarked), else its last fenced block, else what follows a fence left open (a response
    cut at its max_tokens), else the whole text."""
    blocks = fenced_blocks(completion)
    tags = FENCE_TAGS[language]
    marked = [code for lang, code in blocks if lang.lower() in tags]
    if marked:
        return marked[-1]
    if blocks:
        return blocks[-1][1]
    opened = completion.rfind("```")
    return completion if opened < 0 else completion[opened:].partition("\n")[2]


def language_of(completion: str, languages: tuple[str, ...] = LOCAL_LANGUAGES) -> str:
    """``language="auto"``'s choice: the language of ``languages`` the completion's last fenced
    block is marked as (C++: ``cpp``, ``c++``, ``cc``, ``cxx``; ``FENCE_TAGS``), else Python."""
    blocks = fenced_blocks(completion)
    tag = blocks[-1][0].lower() if blocks else ""
    if not blocks:  # (a fence left open: its tag)
        opened = completion.rfind("```")
        tag = completion[opened + 3:].partition("\n")[0].strip().lower() if opened >= 0 else ""
    return next((lang for lang in languages if tag in FENCE_TAGS[lang]), "python")


def _parsed(tests: Any) -> Any:
    if isinstance(tests, str) and tests.lstrip().startswith(("{", "[")):
        try:
            return json.loads(tests)
        except json.JSONDecodeError as exc:
            raise ValueError(f"code_reward: the tests are not JSON ({exc})") from None
    return tests


def time_limit_of(tests: Any) -> float | None:
    """A problem's own time limit, in seconds, where its tests carry one (``time_limit``: a
    number, CodeContests' ``{"seconds", "nanos"}``, or text that starts with a number, "2
    seconds"); None where they do not. ValueError (one line) for one it cannot read."""
    tests = _parsed(tests)
    limit = tests.get("time_limit") if isinstance(tests, dict) else None
    if limit is None:
        return None
    seconds: Any = limit
    if isinstance(limit, dict):
        seconds = float(limit.get("seconds") or 0) + float(limit.get("nanos") or 0) / 1e9
    elif isinstance(limit, str):
        seconds = (limit.split() or [""])[0].rstrip("s")
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ValueError(f"code_reward: the tests' time_limit {str(limit)[:40]!r} is not a "
                         "number of seconds > 0")
    return value


def cases_of(tests: Any) -> list[dict[str, Any]]:
    """A sample's test cases in the runner's form; ValueError naming what is wrong."""
    tests = _parsed(tests)
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


def code_reward(tests: str = "tests", *, mode: str = "fraction", workers: int = 2,
                timeout_s: float = 5.0, memory_mb: int = 512, nproc: int = 64,
                isolation: str = "bwrap", language: str = "python",
                extract: Callable[[str], str] | None = None,
                sandbox_url: str | list[str] | None = None,
                sandbox_token: str = "", retries: int = 3,
                checker: Callable[[str, str, str], Any] | None = None) -> Callable[..., Any]:
    """An ``async def`` map stage function: ``completion`` and the ``tests`` field in,
    ``reward`` out (the share of cases passed; ``mode="all"``: 1.0 only if all pass, and the
    cases after a failure are not run). ``workers``: programs run at once (each a sandbox
    and, inside, one case at a time); ``timeout_s``, ``memory_mb``: each case's wall time
    (at most: a problem whose tests carry a lower ``time_limit`` gets that, ``time_limit_of``)
    and address space; ``nproc``: processes and threads of a slot's uid
    together (a fork bomb's ceiling); ``language``: "python", "cpp" (compiled with g++
    ``-std=c++17 -O2`` in the sandbox, stdin/stdout cases only) or "auto" (C++ where the
    completion's last fenced block is marked so, else Python: ``language_of``);
    ``extract``: the program from the completion (default: its last block of the language,
    ``code_of``); ``sandbox_url``: one or more servers speaking SandboxFusion's ``/run_code``
    (``python -m pivotflow.rl.sandbox_server`` on other hosts, or a SandboxFusion
    deployment) run the programs instead of local sandboxes (``sandbox_client.py``; each
    request tried ``retries`` times; ``isolation`` and ``nproc`` are then the server's;
    ``sandbox_token``: the secret of a server started with ``--token-file``; ``"ray"``:
    servers the run starts on its Ray cluster's nodes, ``ray_sandboxes.py``); ``checker``:
    a special judge for stdin/stdout cases with more than one right answer,
    ``checker(input, output, expected) -> bool``, called on the controller with each case's
    input, the program's stdout and the expected output of a run that exited 0, in place of
    the line-by-line comparison (under ``mode="all"`` the cases after a wrong answer it finds
    still ran; an exception in it is the stage's error).

    Give the stage ``concurrency=workers``: a call out waits for a sandbox inside itself, on
    its stage's ``deadline_s``, where a call over the stage's concurrency waits its turn
    without it.

    Raises ValueError (one line) for a bad argument, or when bubblewrap cannot run and
    ``isolation`` is not "none"."""
    if mode not in MODES:
        raise ValueError(f"code_reward: mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not isinstance(tests, str) or not tests.isidentifier():
        raise ValueError(f"code_reward: tests must name a field, got {tests!r}")
    if checker is not None and not callable(checker):
        raise ValueError(f"code_reward: checker must be a function (input, output, expected) "
                         f"-> bool, got {type(checker).__name__}")
    if language not in LANGUAGES and language not in FENCE_TAGS:
        raise ValueError(f"code_reward: language must be one of {', '.join(LANGUAGES)} (or, "
                         f"on a SandboxFusion deployment, {', '.join(list(FENCE_TAGS)[2:])}), "
                         f"got {language!r}")
    if language not in LANGUAGES and sandbox_url is None:
        raise ValueError(f"code_reward: language {language!r} runs on a SandboxFusion "
                         "deployment only (sandbox_url=...); this host's sandbox runs python "
                         "and cpp")
    # ("auto" picks among what the sandboxes run: every fence's language on servers)
    languages = tuple(FENCE_TAGS) if sandbox_url is not None else LOCAL_LANGUAGES
    runner: CodeRunner | RemoteRunner
    if sandbox_url is not None:
        runner = RemoteRunner([sandbox_url] if isinstance(sandbox_url, str) else
                              list(sandbox_url), workers=workers, timeout_s=timeout_s,
                              memory_mb=memory_mb, retries=retries, token=sandbox_token)
    else:
        runner = CodeRunner(workers=workers, timeout_s=timeout_s, memory_mb=memory_mb,
                            nproc=nproc, isolation=isolation, compiles=language != "python")

    async def reward(completion: str, **fields: Any) -> float:
        given = _parsed(fields[tests])  # (a JSON string read once, not by each reader)
        cases = cases_of(given)
        limit = time_limit_of(given)  # (the problem's own, where it is lower)
        chosen = language_of(completion, languages) if language == "auto" else language
        code = extract(completion) if extract is not None else code_of(completion, chosen)
        results = await runner.run(code, cases, stop_at_failure=mode == "all", language=chosen,
                                   timeout_s=None if limit is None else min(limit, timeout_s),
                                   defer_stdio=checker is not None)
        if checker is not None:
            results = [_checked(checker, case, r) for case, r in zip(cases, results, strict=True)]
        passed = sum(r["outcome"] == "ok" for r in results)
        ran = [r["outcome"] for r in results if r["outcome"] != "skipped"]
        for name in LOGGED if recording_now() else ():
            # each program's share of its cases by outcome, averaged per step
            share = sum(OUTCOME_GROUP.get(o, "other") == name for o in ran) / len(ran)
            log_metric(f"code_{name}", share)
        if mode == "all":
            return 1.0 if passed == len(cases) else 0.0
        return passed / len(cases)

    reward.runner = runner  # type: ignore[attr-defined]
    reward.__signature__ = reads_fields("completion", tests)  # type: ignore[attr-defined]
    reward.__name__ = reward.__qualname__ = "code_reward"  # (.runner: its sandboxes or servers)
    return reward


def _checked(checker: Callable[[str, str, str], Any], case: dict[str, Any],
             result: dict[str, Any]) -> dict[str, Any]:
    """A deferred stdin/stdout case (``ran``) judged by the user's checker; any other as it
    is."""
    if result["outcome"] != "ran":
        return result
    if checker(case["input"], result["stdout"], case["output"]):
        return {"outcome": "ok", "why": ""}
    return {"outcome": "wrong", "why": "the checker refused the output"}

