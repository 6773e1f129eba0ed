"""How a run stops: Ctrl-C and SIGTERM checkpoint what is in flight, then stop the controller
(``Interrupt``); SIGTERM outside the event loop raises like Ctrl-C (``TermBeforeLoop``), so the
run's cleanup still runs; the stop's message names the step checkpointed and the command that
resumes it (``with_hint``)."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from typing import Any

from pivotflow.controller.core import Controller
from pivotflow.errors import RunInterrupted, RunTerminated
from pivotflow.resume import Segment


class TermBeforeLoop:
    """SIGTERM outside the event loop (loading models, writing the records) stops the run as
    Ctrl-C there does, by raising, so ``run``'s cleanup (the shared-memory store) still runs;
    the default action would kill the process and leave the store in /dev/shm."""

    def __init__(self) -> None:
        self.previous: Any = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self.raise_terminated)

    @staticmethod
    def raise_terminated(signum: int, frame: Any) -> None:
        raise RunTerminated("stopped (SIGTERM)")

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def with_hint(error: BaseException, seg: Segment, step: int | None) -> BaseException:
    """An interruption says which step it checkpointed and the command that resumes it."""
    if isinstance(error, RunInterrupted):
        hinted = type(error)(f"{error}: workers reaped, records flushed, "
                             f"{seg.resume_hint(step)}")
        hinted.__cause__ = error.__cause__
        return hinted
    return error


class Interrupt:
    """Ctrl-C or SIGTERM: first take the generations in flight back as partial states and
    checkpoint them (``CheckpointCollector.collect``), then stop; a second signal, or workers
    that do not answer within ``grace_s``, stop at once (the checkpoint then regenerates those
    sequences)."""

    def __init__(self, ctl: Controller, write: Callable[[], None],
                 grace_s: float = 5.0) -> None:
        self.ctl, self.write, self.grace_s = ctl, write, grace_s
        self.requested = self.checkpointed = False

    def on_signal(self, name: str = "SIGINT") -> None:
        stop = (RunInterrupted("interrupted (Ctrl-C)") if name == "SIGINT"
                else RunTerminated(f"stopped ({name})"))
        if self.requested:
            self.ctl.fail(stop)
            return
        self.requested = True

        def write_then_stop() -> None:
            self.write()
            self.checkpointed = True
            self.ctl.fail(stop)
        self.ctl.collector.collect(write_then_stop)
        asyncio.get_running_loop().call_later(self.grace_s, self.ctl.fail, stop)

    on_sigint = on_signal
