"""Worker processes on this machine: started, watched, and always reaped; on a host with GPUs,
each given its own (``CUDA_VISIBLE_DEVICES``), so eight workers on an 8-GPU node use eight GPUs
instead of all opening GPU 0."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pivotflow.errors import ConfigError
from pivotflow.launch.forked_workers import ForkedWorker, WorkerZygote
from pivotflow.transport.admission import TOKEN_ENV, worker_token

if TYPE_CHECKING:
    from pivotflow.launch.launcher_config import LauncherConfig

log = logging.getLogger("pivotflow.launch")

KILLED_EXIT_WAIT_S = 10.0  # for a killed worker to let go of its GPUs before another takes them


def gpu_slots(gpus: list[str], per_worker: float) -> list[list[str]]:
    """The GPU sets workers take in turn: ``gpus`` cut into groups of ``per_worker`` (an
    integer; a rollout engine's tensor parallelism spans them, a leftover GPU stays idle), or
    each GPU shared by ``1 / per_worker`` workers (0.5: two to a GPU). Raises ConfigError for
    another fraction."""
    if per_worker >= 1:
        if per_worker != int(per_worker):
            raise ConfigError(f"--set gpus_per_worker={per_worker}: give a whole number of GPUs, "
                              "or 1/n of one (0.5, 0.25...) for n workers to a GPU")
        k = int(per_worker)
        return [gpus[i: i + k] for i in range(0, len(gpus) - k + 1, k)]
    share = round(1 / per_worker)
    if abs(share * per_worker - 1) > 1e-9:
        raise ConfigError(f"--set gpus_per_worker={per_worker}: a fraction of a GPU must be 1/n "
                          "(0.5, 0.25...)")
    return [[g] for g in gpus for _ in range(share)]


def host_gpus(given: str) -> list[str]:
    """The GPU ids the local launcher hands out: ``given`` ("0,1,2,3"), else this process's
    ``CUDA_VISIBLE_DEVICES``, else every GPU torch sees. Raises ConfigError for a malformed or
    repeated id."""
    text = given or os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if text:
        ids = [g.strip() for g in text.split(",") if g.strip()]
        if len(set(ids)) != len(ids) or not ids:
            raise ConfigError(f"--set gpus={text}: GPU ids must be distinct, comma-separated")
        return ids
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def local_gpu_slots(lc: LauncherConfig, workers: int) -> list[list[str]]:
    """The local launcher's GPU slots for a run of ``workers`` workers: none on CPU or with a
    GPU named in ``device`` (``cuda:N``: every worker on that one, as asked). Raises
    ConfigError when they are fewer than the workers."""
    per_worker = lc.worker_gpus()
    if per_worker <= 0 or ":" in lc.device:
        return []
    gpus = host_gpus(lc.gpus)
    if not gpus:
        raise ConfigError(f"--set device={lc.device}: this host shows no GPU (no "
                          "CUDA_VISIBLE_DEVICES, torch sees none); --set gpus=0,1,... names them")
    slots = gpu_slots(gpus, per_worker)
    if len(slots) < workers:
        raise ConfigError(f"{workers} workers need {workers} GPU slots of {per_worker:g} "
                          f"GPU{'' if per_worker == 1 else 's'}; GPUs {','.join(gpus)} give "
                          f"{len(slots)} (--set gpus=..., gpus_per_worker=..., or fewer pool "
                          "workers)")
    return slots


class LocalLauncher:
    """Starts worker processes as ``python -m pivotflow.worker`` would run; their stderr goes to
    ``log_dir``. With ``fork`` (``worker_start=fork``; ``auto`` on CPU) each is forked from a
    zygote that imported torch and the rest once (``launch/zygote.py``), else exec'd afresh.

    With ``secret`` (the run's, as given to the controller transport) each worker gets its
    token in its environment, which only its own uid (and root) can read; a command line
    (``ps``) would show it to every user."""

    def __init__(self, endpoint: str, log_dir: Path, threads: int = 1,
                 curve_keys: str = "", secret: bytes | None = None,
                 gpu_slots: list[list[str]] | None = None, fork: bool = False) -> None:
        self.endpoint = endpoint
        self._secret = secret
        self.curve_keys = curve_keys
        self.log_dir = log_dir
        self.threads = threads
        self.procs: dict[str, subprocess.Popen[bytes] | ForkedWorker] = {}
        self.gpu_slots = gpu_slots or []  # [] : workers see whatever this process sees
        self.slot_of: dict[str, int] = {}  # worker -> its slot, while it may still run
        self.killed: set[str] = set()
        self.gpus_given: dict[str, str] = {}  # every worker's CUDA_VISIBLE_DEVICES (summary)
        self.fork = fork
        self._zygote: WorkerZygote | None = None  # started with the first worker
        self.zygotes_started = 0  # (summary: more than 1 says one died)
        log_dir.mkdir(parents=True, exist_ok=True)

    def _free_slot(self) -> int:
        """A slot no running worker holds; a killed worker's once it has exited. Raises
        RuntimeError when every slot's worker still runs."""
        for _ in range(2):
            held = {slot for w, slot in self.slot_of.items() if self.procs[w].poll() is None}
            free = [i for i in range(len(self.gpu_slots)) if i not in held]
            if free:
                return free[0]
            for w in [w for w in self.slot_of if w in self.killed]:
                try:  # SIGKILLed: it lets go of its GPUs within moments
                    self.procs[w].wait(KILLED_EXIT_WAIT_S)
                except subprocess.TimeoutExpired:
                    continue
        raise RuntimeError(f"every one of the {len(self.gpu_slots)} GPU slots holds a running "
                           "worker")

    def start(self, worker_id: str) -> None:
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads),
                   MKL_NUM_THREADS=str(self.threads))
        if self.fork:
            self._zygote_for(env)  # (its environment: before this worker's own keys)
        if self.gpu_slots:
            slot = self._free_slot()
            self.slot_of = {w: s for w, s in self.slot_of.items() if s != slot}
            self.slot_of[worker_id] = slot
            env["CUDA_VISIBLE_DEVICES"] = self.gpus_given[worker_id] = ",".join(
                self.gpu_slots[slot])
        if self._secret is not None:
            env[TOKEN_ENV] = worker_token(self._secret, worker_id)
        argv = ["--endpoint", self.endpoint, "--id", worker_id,
                *(["--curve-keys", self.curve_keys] if self.curve_keys else [])]
        log_path = self.log_dir / f"{worker_id}.log"
        if self._zygote is not None:
            self.procs[worker_id] = self._zygote.fork(worker_id, argv, env, log_path)
            return
        log = open(log_path, "wb")  # noqa: SIM115 - owned by the child
        try:
            self.procs[worker_id] = subprocess.Popen(
                [sys.executable, "-m", "pivotflow.worker", *argv],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                start_new_session=True,  # Ctrl-C reaches the controller, which stops workers
            )
        finally:
            log.close()

    def _zygote_for(self, env: dict[str, str]) -> None:
        """The zygote forks the workers; a new one if it died (its workers went with it, and
        the controller replaces them as any dead worker)."""
        if self._zygote is not None and self._zygote.alive:
            return
        if self._zygote is not None:
            log.warning("the worker zygote died (its log: %s); starting another",
                        self._zygote.log_path)
            self._zygote.close(timeout_s=1.0)
        self._zygote = WorkerZygote(self.log_dir / "zygote.log", env)
        self.zygotes_started += 1

    def kill(self, worker_id: str) -> bool:
        """SIGKILL a worker's process (a chaos kill, or a worker declared dead that may still
        run, e.g. paused); True if it was alive. It is reaped by ``stop``."""
        p = self.procs.get(worker_id)
        if p is None or p.poll() is not None:
            return False
        p.kill()
        self.killed.add(worker_id)
        return True

    def stderr_tail(self, worker_id: str, chars: int = 2000) -> str:
        try:
            return (self.log_dir / f"{worker_id}.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def exited(self) -> list[tuple[str, int]]:
        """Workers whose process has exited since they started: (worker_id, return code)."""
        return [(w, code) for w, p in self.procs.items() if (code := p.poll()) is not None]

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
        if self._zygote is not None:
            self._zygote.close()
