"""Worker processes on this machine: started, watched, and always reaped."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from pivotflow.transport.admission import TOKEN_ENV, worker_token


class LocalLauncher:
    """Starts ``python -m pivotflow.worker`` processes; their stderr goes to ``log_dir``.

    With ``secret`` (the run's, as given to the controller transport) each worker gets its
    token in its environment, which only its own uid (and root) can read; a command line
    (``ps``) would show it to every user."""

    def __init__(self, endpoint: str, log_dir: Path, threads: int = 1,
                 curve_keys: str = "", secret: bytes | None = None) -> None:
        self.endpoint = endpoint
        self._secret = secret
        self.curve_keys = curve_keys
        self.log_dir = log_dir
        self.threads = threads
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, worker_id: str) -> None:
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads),
                   MKL_NUM_THREADS=str(self.threads))
        if self._secret is not None:
            env[TOKEN_ENV] = worker_token(self._secret, worker_id)
        log = open(self.log_dir / f"{worker_id}.log", "wb")  # noqa: SIM115 - owned by the child
        try:
            self.procs[worker_id] = subprocess.Popen(
                [sys.executable, "-m", "pivotflow.worker", "--endpoint", self.endpoint,
                 "--id", worker_id,
                 *(["--curve-keys", self.curve_keys] if self.curve_keys else [])],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                start_new_session=True,  # Ctrl-C reaches the controller, which stops workers
            )
        finally:
            log.close()

    def kill(self, worker_id: str) -> bool:
        """SIGKILL a worker's process (a chaos kill, or a worker declared dead that may still
        run, e.g. paused); True if it was alive. It is reaped by ``stop``."""
        p = self.procs.get(worker_id)
        if p is None or p.poll() is not None:
            return False
        p.kill()
        return True

    def stderr_tail(self, worker_id: str, chars: int = 2000) -> str:
        try:
            return (self.log_dir / f"{worker_id}.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def exited(self) -> list[tuple[str, int]]:
        """Workers whose process has exited since they started: (worker_id, return code)."""
        return [(w, p.returncode) for w, p in self.procs.items() if p.poll() is not None]

    def stop(self, timeout_s: float = 5.0) -> None:
        """Wait for workers to exit, then terminate, then kill; reaps every child."""
        deadline = time.monotonic() + timeout_s
        for p in self.procs.values():
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(2.0)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
