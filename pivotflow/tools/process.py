"""One sandboxed tool worker process, seen from the parent: start, talk JSON lines, kill.

The worker runs ``pivotflow.tools.sandbox``, behind ``wall`` (the bwrap command line from
``bwrap.command``, or nothing with ``isolation="none"``), in a session (and process group) of
its own, so killing the group also kills whatever it forked; with bwrap, killing ``bwrap``
ends its whole pid namespace. Its environment is not the controller's: a few harmless
variables only (bwrap clears even those and sets its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pivotflow

_PKG_ROOT = str(Path(pivotflow.__file__).resolve().parents[1])
_PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")


class WorkerProcess:
    """A started tool worker: ``send`` a JSON object, ``recv`` one back within a deadline."""

    def __init__(self, config: dict[str, Any], wall: list[str] | None = None) -> None:
        # never the controller's environment (it may hold keys and tokens): what Python needs
        env = {k: os.environ[k] for k in _PASSED_ENV if k in os.environ}
        # the worker must import pivotflow before it reads its config (which carries sys.path)
        env["PYTHONPATH"] = _PKG_ROOT
        self.proc = subprocess.Popen(
            [*(wall or []), sys.executable, "-m", "pivotflow.tools.sandbox"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            env=env,
        )
        self.pid = self.proc.pid
        self.walled = bool(wall)
        self.ready = False
        self.calls = 0
        self.isolation: dict[str, Any] = {}
        self._buf = bytearray()
        self._fd = self.proc.stdout.fileno() if self.proc.stdout else -1
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        self.started = self.send(config)

    def send(self, obj: dict[str, Any]) -> bool:
        """Write one JSON line; False if the worker's stdin is closed (it is gone)."""
        if self.proc.stdin is None:
            return False
        try:
            self.proc.stdin.write(json.dumps(obj, ensure_ascii=False).encode() + b"\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):  # BrokenPipeError, or a pipe closed by kill()
            return False
        return True

    def recv(self, timeout_s: float, max_bytes: int) -> tuple[str, Any]:
        """The next JSON object as ``("ok", obj)``; else ``("timeout", None)`` if ``timeout_s``
        passed first, ``("gone", why)`` at end of stream or on a line that is not a JSON
        object, ``("too_long", why)`` past ``max_bytes`` (the worker is then unusable)."""
        deadline = time.monotonic() + timeout_s
        while True:
            nl = self._buf.find(b"\n")
            if nl != -1:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                try:
                    obj = json.loads(line)
                except (ValueError, RecursionError) as exc:
                    return "gone", f"unreadable reply: {exc}"
                if not isinstance(obj, dict):
                    return "gone", "reply is not a JSON object"
                return "ok", obj
            if len(self._buf) > max_bytes:
                return "too_long", f"reply over {max_bytes} bytes"
            left = deadline - time.monotonic()
            if left <= 0 or not self._poll.poll(max(1, int(left * 1000))):
                if time.monotonic() >= deadline:
                    return "timeout", None
                continue
            try:
                chunk = os.read(self._fd, 1 << 16)
            except (OSError, ValueError) as exc:
                return "gone", str(exc)
            if not chunk:
                return "gone", "end of stream"
            self._buf += chunk

    def exit_status(self, wait_s: float = 2.0) -> int | None:
        """The worker's return code (negative: killed by that signal), waiting up to ``wait_s``."""
        try:
            rc = self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None
        # bwrap exits with 128 + N when its child was killed by signal N (as a shell does)
        return -(rc - 128) if self.walled and 128 < rc < 128 + 65 else rc

    def kill(self) -> None:
        """SIGKILL the worker's whole process group, reap the worker and close its pipes."""
        self.ready = False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5.0)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def describe_exit(rc: int | None) -> tuple[str, str]:
    """(kind, words) for how a worker ended: CPU signals are "cpu", all else "crash"."""
    if rc is None:
        return "crash", "crashed: its worker process stopped answering"
    if rc < 0:
        sig = -rc
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        if sig in (signal.SIGPROF, signal.SIGXCPU):
            return "cpu", name
        return "crash", f"crashed: its worker process was killed by {name}"
    return "crash", f"crashed: its worker process exited with status {rc}"
