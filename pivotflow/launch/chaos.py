"""Fault injection as a feature: kill workers at random while a run goes on."""

from __future__ import annotations

import asyncio
import logging
import random

from pivotflow.controller.core import Controller
from pivotflow.launch.base import Launcher

log = logging.getLogger("pivotflow.controller")


class Chaos:
    """``--set chaos.kill_worker_every_s=S``: SIGKILL a random serving worker every S seconds
    (counted from when the first worker serves); ``chaos.kill_worker_every_steps=N``: one
    after every N optimizer steps (the same kills on a fast machine and a slow one, which a
    test needs). Anyone can check that their setup loses nothing (the summary's ledger says)."""

    def __init__(self, launcher: Launcher, ctl: Controller, every_s: float,
                 seed: int, every_steps: int = 0) -> None:
        self.launcher, self.ctl, self.every_s = launcher, ctl, every_s
        self.every_steps = every_steps
        self.rng = random.Random(seed + 7919)
        self.killed: list[str] = []  # ids, in order

    @property
    def kills(self) -> int:
        return len(self.killed)

    def unseen(self) -> int:
        """Kills the controller never saw: the run ended (its last step done) within the fleet's
        exit poll of the kill, so the worker was never declared dead nor replaced. A kill while
        a step is still to come lands here only when that step needed nothing of the victim."""
        return sum(self.ctl.workers[w].state != "dead" for w in self.killed)

    async def run(self) -> None:
        if self.every_s <= 0 and self.every_steps <= 0:
            return
        # the clock starts when workers serve: start-up (seconds of imports) is not a target
        while not any(h.state == "ready" for h in self.ctl.workers.values()):
            await asyncio.sleep(0.05)
        await asyncio.gather(*([self._by_time()] if self.every_s > 0 else []),
                             *([self._by_steps()] if self.every_steps > 0 else []))

    async def _by_time(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            self._kill_one()

    async def _by_steps(self) -> None:
        next_step = self.every_steps
        while True:
            await asyncio.sleep(0.02)  # a poll: the step counter has no event to wait on
            if self.ctl.version < next_step:
                continue
            # a kill that finds no worker ready (all loading, or a recovery under way) is
            # tried again at the next poll, until it lands or the next kill is due: on a
            # fast machine every due kill once met such a moment and a run had no kill
            if self._kill_one() or self.ctl.version >= next_step + self.every_steps:
                next_step += self.every_steps

    def _kill_one(self) -> bool:
        if self.ctl.version >= self.ctl.cfg.steps:
            # the run is ending (its last step done; records, checkpoint, shutdown): a kill
            # now tests no recovery, and none would follow it (a kill after the 20th of 20
            # steps counted one more kill than restarts)
            return False
        serving = sorted(w for w, h in self.ctl.workers.items() if h.state == "ready")
        victim = self.rng.choice(serving) if serving else None
        if victim is not None and self.launcher.kill(victim):
            self.killed.append(victim)
            # the log says when (a kill's death is seen up to the exit poll later)
            log.warning("chaos: killed %s after step %d", victim, self.ctl.version)
            return True
        return False
