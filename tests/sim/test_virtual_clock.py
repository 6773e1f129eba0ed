from __future__ import annotations

import asyncio
import time

import pytest

from pivotflow.errors import SimulationError
from pivotflow.sim.virtual_clock import SimClock, run_virtual


def test_an_hour_of_sleeps_takes_no_wall_time() -> None:
    async def main() -> tuple[float, list[float]]:
        loop = asyncio.get_running_loop()
        clock = SimClock(loop)
        t0 = clock.now()

        async def wake(after: float) -> float:
            await clock.sleep(after)
            return clock.now() - t0

        order = await asyncio.gather(wake(3600), wake(1.5), wake(0.25))
        return clock.now() - t0, order

    wall = time.perf_counter()
    elapsed, order = run_virtual(main())
    assert elapsed == pytest.approx(3600)
    assert order == pytest.approx([3600, 1.5, 0.25])
    assert time.perf_counter() - wall < 1.0


def test_timeouts_fire_in_virtual_time() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(100), 10)
        return loop.time()

    assert run_virtual(main(), start=5.0) == pytest.approx(15.0)


def test_deadlock_is_an_error() -> None:
    async def main() -> None:
        await asyncio.Event().wait()  # nothing will ever set it

    with pytest.raises(SimulationError, match="deadlock"):
        run_virtual(main())
