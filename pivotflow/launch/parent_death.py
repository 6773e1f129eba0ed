"""A child process that dies with its parent (Linux's ``PR_SET_PDEATHSIG``): a Ray host actor's
worker, a worker forked by the local launcher's zygote. Nothing outlives the process that
watches it to hold a GPU, a port or a core."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
# loaded before any fork: a child between fork and exec may only make the prctl call
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def die_with_parent(parent: int) -> None:
    """In a just-forked child: SIGKILL it when the thread that forked it goes (so with
    ``parent``, a single-threaded one); if the parent went already, before the prctl took
    effect, go now."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)
