"""The local launcher's side of its worker zygote (``launch/zygote.py``): the zygote process it
owns, and a handle per forked worker that answers as ``subprocess.Popen`` does (``pid``,
``poll``, ``wait``, ``kill``, ``terminate``, ``returncode``), so the launcher treats forked and
exec'd workers alike."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from pivotflow.errors import ProtocolError
from pivotflow.launch.zygote_frames import FrameReader, write_frame
from pivotflow.protocol import ForkWorker, FromZygote, WorkerExited, WorkerForked

log = logging.getLogger("pivotflow.launch")

GONE_WITH_ZYGOTE = -signal.SIGKILL  # its workers' code when the zygote died (PDEATHSIG)
PID_WAIT_S = 120.0  # for the zygote's first answer: it imports torch before it serves


class ForkedWorker:
    """One worker forked by ``zygote``."""

    def __init__(self, zygote: WorkerZygote, worker_id: str, log_path: Path) -> None:
        self.zygote, self.worker_id, self.log_path = zygote, worker_id, log_path
        self._pid: int | None = None
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        """Its pid, once the zygote answered (within moments once it has loaded)."""
        deadline = time.monotonic() + PID_WAIT_S
        while self._pid is None and self.returncode is None:
            if (not self.zygote.pump(max(0.0, deadline - time.monotonic()))
                    and time.monotonic() >= deadline):
                raise RuntimeError(f"the worker zygote gave no pid for {self.worker_id} in "
                                   f"{PID_WAIT_S:.0f}s (its log: {self.zygote.log_path})")
        return self._pid or 0

    def poll(self) -> int | None:
        self.zygote.pump(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """As Popen's: an exit already reported counts even at ``timeout`` 0."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.worker_id, timeout or 0.0)
            self.zygote.pump(left)  # until the zygote says anything (of any worker)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        # a pid the zygote reaped can be taken by a new process before its exit frame is read
        # here: a window of moments that the kernel's pid cycle makes harmless (Popen has the
        # same between its own waitpid and returncode)
        if self.poll() is None and self.pid > 0:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class WorkerZygote:
    """``python -m pivotflow.launch.zygote``, started with ``env`` (the workers' thread
    settings), its stderr to ``log_path``. One owner: the local launcher."""

    def __init__(self, log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pivotflow.launch.zygote"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, env=env,
                start_new_session=True)  # Ctrl-C is the controller's
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._to, self._from = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        os.set_blocking(self._from, False)
        self._reader: FrameReader[FromZygote] = FrameReader(FromZygote, "the worker zygote")
        self.workers: dict[str, ForkedWorker] = {}
        self.alive = True

    def fork(self, worker_id: str, argv: list[str], env: dict[str, str],
             log_path: Path) -> ForkedWorker:
        handle = ForkedWorker(self, worker_id, log_path)
        self.workers[worker_id] = handle
        try:
            write_frame(self._to, ForkWorker(worker_id=worker_id, argv=argv, env=env,
                                             log_path=str(log_path)))
        except OSError:  # (BrokenPipeError) it died: the worker never starts
            self._lost()
        return handle

    def pump(self, timeout: float | None) -> bool:
        """Read what the zygote said within ``timeout`` seconds; True if anything came."""
        if not self.alive:
            return False
        ready, _, _ = select.select([self._from], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self._from, 1 << 16)
        except BlockingIOError:
            return False
        if not data:
            self._lost()
            return True
        try:
            for msg in self._reader.feed(data):
                self._take(msg)
        except ProtocolError as exc:  # not trusted with more workers: closed, with its own
            log.warning("%s; closing it (a new one forks the next worker)", exc)
            self._lost()
            self.close()
        return True

    def _take(self, msg: FromZygote) -> None:
        handle = self.workers.get(msg.worker_id)
        if handle is None:
            return
        if isinstance(msg, WorkerForked):
            handle._pid = msg.pid
        elif isinstance(msg, WorkerExited):
            handle.returncode = msg.code
            handle._pid = handle._pid or msg.pid

    def _lost(self) -> None:
        """The zygote is gone, and every worker it had with it (PR_SET_PDEATHSIG). Each one's
        log, whose tail the controller quotes, says so, with the zygote's own last words (an
        import that failed, a frame it could not read)."""
        if not self.alive:
            return
        self.alive = False
        gone = [h for h in self.workers.values() if h.returncode is None]
        if not gone:
            return
        code = None
        with contextlib.suppress(subprocess.TimeoutExpired):  # (its pipe closes as it exits)
            code = self.proc.wait(1.0)
        try:
            tail = self.log_path.read_text(errors="replace")[-1500:]
        except OSError:
            tail = ""
        for handle in gone:
            handle.returncode = GONE_WITH_ZYGOTE
            with contextlib.suppress(OSError), open(handle.log_path, "a") as log_file:
                log_file.write(f"[pivotflow] this worker went with the worker zygote, which "
                               f"{'ended' if code is None else f'exited with code {code}'}; "
                               f"the tail of {self.log_path.name}:\n{tail}\n")

    def close(self, timeout_s: float = 5.0) -> None:
        """Close its stdin (it exits, its workers with it) and reap it."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        while self.alive and self.pump(0.0):  # the exits it reported before it went
            pass
        self._lost()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
