"""The small Ray actor that hosts one worker process on its node (``launch/ray.py`` places it).

It starts the unchanged ``python -m pivotflow.worker``, keeps its log in a node-local folder
(the run folder lives on the controller's host), and answers for it: its exit code, a kill,
the log's tail. The worker is the actor's child and dies with it (``PR_SET_PDEATHSIG``): a node
that goes takes its workers, and nothing outlives a killed actor to hold a GPU.

Only Ray imports this module, on the worker's node; it needs nothing from the controller but
the command line (the CurveZMQ keys are files on the node; only their folder is named).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from pivotflow.launch.parent_death import die_with_parent


def log_root(run_tag: str) -> Path:
    """Where this node keeps the run's worker logs."""
    return Path(tempfile.gettempdir()) / "pivotflow-ray" / run_tag


class WorkerHost:
    """One worker process on this node. Threaded (``max_concurrency`` > 1): ``wait`` blocks
    while ``kill``, ``tail`` and ``free_port`` answer."""

    def __init__(self, run_tag: str) -> None:
        self.root = log_root(run_tag)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self.started = threading.Event()

    def where(self) -> dict[str, Any]:
        """This node's address and id, and the GPUs Ray gave this actor's bundle."""
        import ray

        return {"ip": ray.util.get_node_ip_address(),
                "node_id": ray.get_runtime_context().get_node_id(),
                "gpus": [str(g) for g in ray.get_gpu_ids()]}

    def start(self, worker_id: str, argv: list[str], threads: int, secret_file: str = "") -> int:
        """Start the worker; its pid. Ray already set CUDA_VISIBLE_DEVICES for the bundle.

        ``secret_file`` (a 0600 file on this node holding the run's secret; its path, never its
        bytes, travels through Ray): the worker gets its token in its environment, as the
        local launcher gives it."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.log_path = self.root / f"{worker_id}.log"
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        if secret_file:
            from pivotflow.transport.admission import TOKEN_ENV, worker_token

            try:
                secret = Path(secret_file).read_bytes()
            except OSError as e:
                raise RuntimeError(f"the run's secret file {secret_file} cannot be read on "
                                   f"node {self.where()['ip']}: {e.strerror}") from None
            env[TOKEN_ENV] = worker_token(secret, worker_id)
        parent = os.getpid()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pivotflow.worker", *argv], stdin=subprocess.DEVNULL,
                stdout=log, stderr=log, env=env, start_new_session=True,
                preexec_fn=lambda: die_with_parent(parent))
        self.started.set()
        return self.proc.pid

    def wait(self) -> int:
        """Block until the worker exits; its return code (negative: the signal)."""
        self.started.wait()
        assert self.proc is not None
        return self.proc.wait()

    def kill(self) -> bool:
        """SIGKILL the worker; True if it was running."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        self.proc.kill()
        self.proc.wait()
        return True

    def terminate(self, grace_s: float) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``; returns when it is reaped."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def tail(self, chars: int) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:] if self.log_path else ""
        except OSError:
            return ""

    def take_log(self, max_bytes: int) -> bytes:
        """The log's last ``max_bytes``, for the run folder on the controller's host; the
        node's copy goes (and the run's folder here, once empty)."""
        if self.log_path is None:
            return b""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
                data = f.read()
        except OSError:
            return b""
        self.log_path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.root.rmdir()  # only when empty: other workers of the run may log here
        return data

    def free_port(self) -> tuple[str, int]:
        """A TCP port free on this node now (the trainers' rendezvous when this worker is
        rank 0), with the node's address. Bound and released: rank 0 binds it right after."""
        ip = self.where()["ip"]
        with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as s:
            s.bind((ip, 0))
            return ip, int(s.getsockname()[1])
