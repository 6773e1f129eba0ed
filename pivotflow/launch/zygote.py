"""``python -m pivotflow.launch.zygote``: the local launcher's worker zygote.

A worker's start was mostly imports: torch, tokenizers, zmq and what ``warm_torch`` pulls in
(torch._dynamo, sympy), 3.5-5 CPU seconds before it could say Hello, on every start and every
restart, three or more at once on a run's first seconds. The zygote pays them once per launcher:
it imports all of it, then forks each worker on request (``ForkWorker`` on its stdin), and the
child goes on from there as ``python -m pivotflow.worker`` would: its own session (Ctrl-C is
the controller's), its log as stdout and stderr, the environment the launcher gave it, every
other descriptor closed. ``bench/worker_start.py`` measures fork against exec.

The zygote answers each fork with the pid (``WorkerForked``), reaps its children and reports
how each ended (``WorkerExited``) on its stdout. Its workers die with it (``PR_SET_PDEATHSIG``):
the launcher that loses the zygote knows they are gone. It exits when its stdin closes.

What differs from a fresh interpreter: the workers of one zygote share its string hash seed
and numpy's global random state (nothing of pivotflow draws from either; Python's ``random``
reseeds itself in a forked child), and the libraries' import-time reads of the environment are
the zygote's (the launcher starts it with the workers' thread settings, the only ones that
differ from its own). The zygote never initializes CUDA (a child of a process that had would
find it unusable), so a forked worker could take a GPU; that has not run on one yet, and
``worker_start=auto`` execs GPU workers.
"""

from __future__ import annotations

import contextlib
import gc
import os
import selectors
import signal
import sys
from typing import NoReturn

from pivotflow.errors import ProtocolError
from pivotflow.launch.parent_death import die_with_parent
from pivotflow.launch.zygote_frames import FrameReader, write_frame
from pivotflow.protocol import ForkWorker, WorkerExited, WorkerForked

MAX_FD = 1 << 20  # descriptors a child closes up to: one close_range call on Linux
CANNOT_START = 126  # a WorkerExited's code when the fork itself failed


def preload() -> None:
    """Everything a worker imports before its Hello."""
    from pivotflow.worker.main import warm_torch

    warm_torch()
    gc.freeze()  # (the workers' pages stay shared with it: worker/main.py says more)


class Zygote:
    """The serving loop. ``serve`` returns only in a forked child, with its request."""

    def __init__(self, frames_in: int, frames_out: int) -> None:
        self.frames_in, self.frames_out = frames_in, frames_out
        self.children: dict[int, str] = {}  # pid -> worker id
        self.reader: FrameReader[ForkWorker] = FrameReader(ForkWorker, "the launcher")

    def serve(self) -> ForkWorker | None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        # SIGCHLD wakes the select through the pipe (a Python handler alone would not)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w)
        sel = selectors.DefaultSelector()
        sel.register(self.frames_in, selectors.EVENT_READ)
        sel.register(wake_r, selectors.EVENT_READ)
        try:
            while True:
                for key, _ in sel.select():
                    if key.fd == wake_r:
                        with contextlib.suppress(BlockingIOError):
                            while os.read(wake_r, 4096):
                                pass
                        continue
                    data = os.read(self.frames_in, 1 << 16)
                    if not data:
                        return None  # the launcher closed us: the workers die with us
                    for req in self.reader.feed(data):
                        if self._fork(req):
                            return req  # in the child
                self._reap()
        finally:  # in the zygote as it exits, and in a child before it becomes the worker
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            sel.close()
            os.close(wake_r)
            os.close(wake_w)

    def _fork(self, req: ForkWorker) -> bool:
        """Fork ``req``'s worker; True in the child."""
        parent = os.getpid()
        ready_r, ready_w = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:  # (EAGAIN, ENOMEM): the launcher sees a worker that never ran
            os.close(ready_r)
            os.close(ready_w)
            with open(req.log_path, "a") as log:
                log.write(f"the worker zygote could not fork: {exc}\n")
            write_frame(self.frames_out, WorkerExited(worker_id=req.worker_id, pid=0,
                                                      code=CANNOT_START))
            return False
        if pid == 0:
            # before the launcher hears of it, as Popen returns only after the child's setsid:
            # from WorkerForked on, a Ctrl-C at the terminal misses it and it dies with us
            os.setsid()
            die_with_parent(parent)
            os.close(ready_w)  # (the pipe's EOF is the signal)
            os.close(ready_r)
            return True
        os.close(ready_w)
        os.read(ready_r, 1)  # EOF once the child closed its end (or died)
        os.close(ready_r)
        self.children[pid] = req.worker_id
        write_frame(self.frames_out, WorkerForked(worker_id=req.worker_id, pid=pid))
        return False

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            worker_id = self.children.pop(pid, None)
            if worker_id is not None:
                write_frame(self.frames_out, WorkerExited(
                    worker_id=worker_id, pid=pid, code=os.waitstatus_to_exitcode(status)))


def become_worker(req: ForkWorker) -> None:
    """In the child (in its own session already): what ``subprocess.Popen`` gave an exec'd
    worker, and nothing else."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    log = os.open(req.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.closerange(3, MAX_FD)  # the zygote's pipes and selector among them
    os.environ.clear()
    os.environ.update(req.env)
    sys.argv = [os.path.join(os.path.dirname(os.path.dirname(__file__)), "worker",
                             "__main__.py"), *req.argv]  # as ``python -m`` sets it


def end_zygote(code: int) -> NoReturn:
    """The zygote holds nothing to clean up: it ends without the interpreter's teardown (what
    it imported is frozen; worker/main.py's ``end_process`` says why that matters)."""
    sys.stderr.flush()
    os._exit(code)


def main() -> NoReturn:
    # the frames get descriptors of their own, and 0/1 point elsewhere: a library that prints
    # while it loads must not write into the launcher's pipe
    frames_in, frames_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (its own session too: the controller's)
    preload()
    try:
        req = Zygote(frames_in, frames_out).serve()
    except ProtocolError as exc:  # the launcher sees its pipe close: every worker is gone
        print(f"worker zygote: {exc}; exiting", file=sys.stderr)
        end_zygote(2)
    if req is None:
        end_zygote(0)
    become_worker(req)
    from pivotflow.worker.__main__ import run_process

    run_process(req.argv)


if __name__ == "__main__":
    main()
