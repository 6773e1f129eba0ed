"""Virtual time: an asyncio event loop whose clock jumps to the next timer when nothing is ready.

The loop is a plain ``SelectorEventLoop`` with two changes: ``time()`` returns a virtual clock,
and the selector never blocks. Where a real loop would sleep ``timeout`` seconds in ``select``
waiting for the next timer, this one polls its file descriptors without waiting and, if none is
ready, moves the clock forward by ``timeout``. So every ``asyncio.sleep``, ``call_later``,
``wait_for`` and the controller's clock run in virtual seconds, and a simulated hour costs only
the CPU time of the callbacks it runs (the idea of the ``looptime`` package, written small).
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

from pivotflow.errors import SimulationError

T = TypeVar("T")
POLL_EVERY = 64


class _VirtualSelector(selectors.DefaultSelector):
    """Polls real descriptors (the loop's self-pipe) without blocking; advances virtual time."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._vloop = loop
        self._turns = 0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None:
            # A real poll is a syscall per turn (~15% of a simulation); the descriptors (the
            # self-pipe, which only wakes a blocked select, e.g. for Ctrl-C) are polled every
            # POLL_EVERY turns, and always before declaring a deadlock.
            self._turns += 1
            if self._turns < POLL_EVERY:
                if timeout > 0:
                    self._vloop._advance_to(self._vloop.time() + timeout)
                return []
        self._turns = 0
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            # Nothing ready and no timer: every task waits for something that cannot happen.
            raise SimulationError(
                f"simulation deadlock at virtual t={self._vloop.time():.3f}s: no callback is "
                "ready and no timer is scheduled"
            )
        self._vloop._advance_to(self._vloop.time() + timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop in virtual time, starting at ``start`` seconds."""

    def __init__(self, start: float = 0.0) -> None:
        self._vnow = float(start)
        self.jumps = 0  # how often the clock moved (a measure of simulated events)
        super().__init__(selector=_VirtualSelector(self))

    def time(self) -> float:
        return self._vnow

    def _advance_to(self, when: float) -> None:
        if when > self._vnow:
            self._vnow = when
            self.jumps += 1


class SimClock:
    """The controller's ``Clock`` in virtual time: ``now`` is the running loop's time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def now(self) -> float:
        return self._loop.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def run_virtual(main: Coroutine[Any, Any, T], *, start: float = 0.0) -> T:
    """Run ``main`` to completion on a fresh ``VirtualTimeLoop`` and close the loop.

    Raises whatever ``main`` raises, and SimulationError when the simulation deadlocks.
    """
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(start)) as runner:
        return runner.run(main)
