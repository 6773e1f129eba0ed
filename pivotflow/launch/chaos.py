"""Fault injection as a feature: kill workers at random while a run goes on."""

from __future__ import annotations

import asyncio
import random

from pivotflow.controller.core import Controller
from pivotflow.launch.local import LocalLauncher


class Chaos:
    """``--set chaos.kill_worker_every_s=S``: SIGKILL a random serving worker every S seconds
    (counted from when the first worker serves),
    so anyone can check that their setup loses nothing (the summary's ledger says)."""

    def __init__(self, launcher: LocalLauncher, ctl: Controller, every_s: float,
                 seed: int) -> None:
        self.launcher, self.ctl, self.every_s = launcher, ctl, every_s
        self.rng = random.Random(seed + 7919)
        self.kills = 0

    async def run(self) -> None:
        if self.every_s <= 0:
            return
        # the clock starts when workers serve: start-up (seconds of imports) is not a target
        while not any(h.state == "ready" for h in self.ctl.workers.values()):
            await asyncio.sleep(0.05)
        while True:
            await asyncio.sleep(self.every_s)
            serving = sorted(w for w, h in self.ctl.workers.items() if h.state == "ready")
            if serving and self.launcher.kill(self.rng.choice(serving)):
                self.kills += 1
