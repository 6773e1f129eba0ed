"""The controller's time source, injected so the simulator can run it in virtual time."""

from __future__ import annotations

import asyncio
from typing import Protocol


class Clock(Protocol):
    """What the controller asks of time: the current time and a way to wait."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class LoopClock:
    """Wall time from the running event loop's monotonic clock."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
