"""Worker processes as a run's fleet (``assembly.Fleet``): a launcher starts them, this watches
them exit, and a dead one is replaced by a new process under a new id."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from pivotflow.launch.base import Launcher
from pivotflow.launch.workers import attach

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller
    from pivotflow.controller.recovery import Respawn

EXIT_POLL_S = 0.25  # how soon a process's exit reaches the controller as a death


class LauncherFleet:
    """The processes of ``assignments``' workers, on ``launcher`` (local or Ray)."""

    def __init__(self, launcher: Launcher, assignments: dict[str, str]) -> None:
        self.launcher = launcher
        self.assignments = assignments
        self._ctl: Controller | None = None
        self.respawn: Respawn | None = self._respawn

    def _respawn(self, new_id: str, old_id: str) -> None:
        self.launcher.kill(old_id)  # declared dead: a paused process must not come back to life
        self.launcher.start(new_id)

    def bind(self, ctl: Controller) -> None:
        self._ctl = ctl
        attach(self.launcher, ctl)

    def start(self) -> None:
        for wid in self.assignments:
            self.launcher.start(wid)

    def serving(self) -> list[Coroutine[Any, Any, None]]:
        return [self._watch_exits()]

    def close(self) -> None:
        self.launcher.stop()

    async def _watch_exits(self) -> None:
        """Turn a worker process's exit into a typed event: the controller declares it dead
        (with its stderr's tail) at once, instead of waiting out its heartbeat timeout."""
        ctl = self._ctl
        assert ctl is not None, "bind() comes before serving()"
        while True:
            await asyncio.sleep(EXIT_POLL_S)
            for wid, code in self.launcher.exited():
                w = ctl.workers.get(wid)
                if w is not None and w.state != "dead":
                    tail = self.launcher.stderr_tail(wid)
                    ctl.worker_died(wid, f"process exited with code {code}; stderr tail:\n{tail}")
