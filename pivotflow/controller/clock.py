"""The controller's time source, injected so the simulator can run it in virtual time."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """What the controller asks of time: the current time and a way to wait."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class LoopClock:
    """Wall time. ``perf_counter``, not ``loop.time()``: uvloop's loop time ticks in whole
    milliseconds, too coarse for job round trips of tens of microseconds."""

    def now(self) -> float:
        return time.perf_counter()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
