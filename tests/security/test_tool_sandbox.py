"""Issue 27's attacks on the tool sandbox, each on real bubblewrap-sandboxed processes: every
one is refused or contained, and what it does is counted in the pool's kinds."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import pivotflow
from pivotflow.errors import ConfigError, ToolError
from pivotflow.tools import ToolCall, ToolPool, ToolRegistry
from pivotflow.tools import bwrap as bw
from pivotflow.tools.builtin import calculator

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(bw.executable() is None, reason="bubblewrap is not installed"),
]

SECRET_VAR = "PIVOTFLOW_TEST_CONTROLLER_SECRET"


def _pool(**kw: object) -> ToolPool:
    registry = ToolRegistry([calculator])
    registry.load("sandbox_attacks")
    opts: dict = {"workers": 1, "timeout_s": 10.0, "memory_mb": 256, "nproc": 24, **kw}
    return ToolPool(registry, **opts)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def pool() -> Iterator[ToolPool]:
    os.environ[SECRET_VAR] = "s3cr3t-" + uuid.uuid4().hex  # the controller's environment
    try:
        with _pool() as p:
            yield p
    finally:
        del os.environ[SECRET_VAR]


def _call(pool: ToolPool, name: str, **args: object) -> str:
    r = pool.call(ToolCall(name, dict(args)))
    assert r.kind == "ok", r
    return r.content


def _with_marker(marker: str) -> list[int]:
    """Host pids whose command line carries ``marker``."""
    found = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{p}/cmdline").read_bytes():
                    found.append(int(p))
            except OSError:
                pass
    return found


def _descendants(root: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                ppid = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(p))
    out, todo = set(), [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def test_unprivileged_uid_clean_env_own_pid_namespace(pool: ToolPool) -> None:
    assert pool.isolation["os"] == "bwrap" and pool.isolation["uid"] == 65534
    seen = json.loads(_call(pool, "environment"))
    assert seen["uid"] == 65534 and seen["pid"] == 2
    assert SECRET_VAR not in seen["env"], "the controller's environment reached the tool"
    assert set(seen["env"]) <= {"HOME", "TMPDIR", "PATH", "PYTHONDONTWRITEBYTECODE",
                                "PYTHONNOUSERSITE", "PYTHONPATH", "PWD", "LC_CTYPE"}


def test_system_secrets_and_homes_are_not_there(pool: ToolPool) -> None:
    assert _call(pool, "read_file", path="/etc/shadow").startswith("FileNotFoundError")
    roots = bw.read_only_roots(["sandbox_attacks:read_file"])
    listed = _call(pool, "read_file", path="/root")
    for entry in os.listdir("/root"):  # only the folders leading to Python may show
        if not any(r.startswith(f"/root/{entry}/") or r == f"/root/{entry}" for r in roots):
            assert f"'{entry}'" not in listed, f"/root/{entry} is visible: {listed}"
    assert _call(pool, "read_file", path="/home").startswith("FileNotFoundError")


def test_writes_outside_the_private_tmp_fail(pool: ToolPool, tmp_path: Path) -> None:
    pkg_file = Path(pivotflow.__file__).parent / f"pwned-{uuid.uuid4().hex}.txt"
    try:
        assert "Read-only file system" in _call(pool, "append_file", path=str(pkg_file),
                                                  text="x")
    finally:
        assert not pkg_file.exists(), "a tool wrote into the pivotflow package"
    host = tmp_path / "host.txt"
    host.write_text("mine")
    # the tool's /tmp is a private tmpfs: the host's /tmp/... is not in it
    assert _call(pool, "append_file", path=str(host), text="pwned").startswith(
        "FileNotFoundError")
    assert host.read_text() == "mine"
    assert _call(pool, "append_file", path="/tmp/own.txt", text="fine") == "ok: 4"
    for elsewhere in ("/x", "/dev/shm/x", "/root/x", "/usr/x"):  # no other tmpfs to fill
        assert not _call(pool, "append_file", path=elsewhere, text="x").startswith("ok"), elsewhere


def test_the_run_folder_is_hidden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "project"
    run = project / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "summary.json").write_text('{"steps": 3}')
    # a graph module's folder, with its tools, and the run folder inside it
    shutil.copy(Path(__file__).with_name("graph_folder_tools.py"), project / "project_tools.py")
    monkeypatch.syspath_prepend(str(project))
    registry = ToolRegistry()
    registry.load("project_tools")
    with ToolPool(registry, workers=1, hidden_paths=(str(run),)) as p:
        summary = str(run / "summary.json")
        assert p.call(ToolCall("peek", {"path": str(run)})).content.startswith("Permission")
        assert "Error" in p.call(ToolCall("peek", {"path": summary})).content
        assert "Error" in p.call(ToolCall("poke", {"path": summary})).content
        # the graph module's own folder is there, read-only
        assert "project_tools.py" in p.call(ToolCall("peek", {"path": str(project)})).content
        assert "Read-only" in p.call(ToolCall("poke", {"path": str(project / "x")})).content
    assert (run / "summary.json").read_text() == '{"steps": 3}'


def test_proc_of_the_controller_is_not_there(pool: ToolPool) -> None:
    for pid in (os.getpid(), os.getppid(), 1):
        got = _call(pool, "read_file", path=f"/proc/{pid}/environ")
        assert os.environ[SECRET_VAR] not in got
        assert not got.startswith("ok"), got


def test_ctypes_system_runs_as_nobody_inside(pool: ToolPool, tmp_path: Path) -> None:
    host = tmp_path / "pwned"
    got = json.loads(_call(pool, "libc_system",
                           command=f"id -u > /tmp/out; cat /etc/shadow >> /tmp/out 2>&1; "
                                   f"id > {host}"))
    assert got["out"].splitlines()[0] == "65534"
    assert "No such file" in got["out"]
    assert not host.exists()


def test_gc_trick_is_caught_and_contained(pool: ToolPool, tmp_path: Path) -> None:
    host = tmp_path / "pwned"
    before = pool.counters["forbidden"]
    naive = pool.call(ToolCall("gc_trick", {"host_path": str(host), "restore": False}))
    assert naive.kind == "forbidden" and "audit hook off" in naive.content
    assert pool.counters["forbidden"] == before + 1
    # one that switches the hook back on goes unnoticed by the hook, and still gets nothing
    hidden = json.loads(_call(pool, "gc_trick", host_path=str(host), restore=True))
    assert hidden["found_guard"] and hidden["id"] == "rc=0 out=65534"
    assert not hidden["shadow"].startswith("rc=0")
    assert "pivotflow" not in hidden["root"]
    assert not host.exists()


def _call_in_thread(pool: ToolPool, call: ToolCall) -> tuple[threading.Thread, list]:
    box: list = []
    t = threading.Thread(target=lambda: box.append(pool.call(call)), daemon=True)
    t.start()
    return t, box


def _wait_for(cond, timeout_s: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    return cond()


def test_setsid_survivor_dies_with_the_call(pool: ToolPool) -> None:
    marker = f"survivor-{uuid.uuid4().hex}"
    t, box = _call_in_thread(pool, ToolCall("setsid_survivor",
                                            {"marker": marker, "linger_s": 2.0}))
    assert _wait_for(lambda: _with_marker(marker)), "the survivor never started"
    t.join(20)
    assert box[0].kind == "fork" and "left a child process running" in box[0].content
    assert _wait_for(lambda: not _with_marker(marker), 5), "a setsid child outlived its call"


def test_setsid_survivor_dies_with_close() -> None:
    marker = f"survivor-{uuid.uuid4().hex}"
    p = _pool(workers=2, timeout_s=30.0)
    t, _ = _call_in_thread(p, ToolCall("setsid_survivor", {"marker": marker, "linger_s": 20.0}))
    assert _wait_for(lambda: _with_marker(marker)), "the survivor never started"
    p.close()
    assert _wait_for(lambda: not _with_marker(marker), 5), "a setsid child outlived close()"
    t.join(20)


def test_fork_bomb_is_bounded_by_the_process_limit() -> None:
    with _pool(nproc=16, timeout_s=20.0) as p:
        (bwrap_pid,) = p.pids()
        t, box = _call_in_thread(p, ToolCall("fork_bomb", {"forks": 5000}))
        peak = 0
        while t.is_alive():
            peak = max(peak, len(_descendants(bwrap_pid)))
            time.sleep(0.02)
        # the bomb hit the limit (its fork failed); the 20 ms sampler may see its processes
        # or not (on a busy machine they come and go between samples), never more than that
        assert box[0].kind == "fork", box[0]
        assert peak <= 16 + 2, f"{peak} processes under one sandbox (limit 16 + init)"
        assert p.counters["fork"] == 1
        assert not _descendants(bwrap_pid)


def test_8gb_allocation_is_refused(pool: ToolPool) -> None:
    r = pool.call(ToolCall("allocate", {"gigabytes": 8}))
    assert r.kind == "memory", r


def test_file_size_limit(pool: ToolPool) -> None:
    assert "File too large" in _call(pool, "big_file", megabytes=32)


def test_no_network_even_with_the_hook_off(pool: ToolPool) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        got = _call(pool, "connect", port=server.getsockname()[1])
        assert not got.startswith("ok"), got
        with pytest.raises(TimeoutError):
            server.accept()


def test_no_isolation_without_bwrap_unless_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ConfigError, match="isolation must be one of bwrap, none, got 'x'"):
        _pool(isolation="x")
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    with pytest.raises(ToolError, match=r"cannot isolate tool calls: bubblewrap \(bwrap\) is "
                       r"not installed; .* or set tool_pool.isolation=none"):
        _pool()
    with caplog.at_level(logging.WARNING, "pivotflow.tools"), _pool(isolation="none") as p:
        assert p.isolation["os"] == "none"
        assert p.call(ToolCall("calculator", {"expression": "6*7"})).content == "42"
    assert "isolation=none: tools run WITHOUT operating-system isolation" in caplog.text


def test_a_worker_outlives_the_thread_whose_call_started_it() -> None:
    # bwrap's --die-with-parent follows the thread that forked it: a replacement started by a
    # caller's thread died when that thread ended (at random, before; here always: the thread
    # lingers until bwrap has set it up, then ends)
    with _pool(max_calls_per_worker=1) as p:
        def call_then_end() -> None:
            assert p.call(ToolCall("calculator", {"expression": "1+1"})).kind == "ok"
            time.sleep(1.0)  # the replacement's bwrap is up and watching this thread

        for _ in range(2):
            t = threading.Thread(target=call_then_end)
            t.start()
            t.join()
            time.sleep(0.3)
            r = p.call(ToolCall("calculator", {"expression": "2+2"}))
            assert r.kind == "ok", r
        assert p.counters["crash"] == 0
