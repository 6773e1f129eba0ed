"""Workers that die or go silent lose nothing: their jobs run again elsewhere (token for token
the same), a replacement joins under a new id, and whatever the old id sends later is dropped."""

from __future__ import annotations

import asyncio

import pytest
from harness import Harness, TokenWorker, expected_tokens, start_workers
from test_shifts import POOLS

from pivotflow.errors import WorkerError


class Cluster:
    """The harness's workers, plus replacements started the way a launcher would."""

    def __init__(self, steps: int, **kw: object) -> None:
        self.h = Harness(steps=steps, assignments=dict(POOLS), respawn=self.respawn,
                         group_size=4, groups_per_step=3, **kw)  # type: ignore[arg-type]
        self.tasks: list[asyncio.Task[None]] = []
        self.workers: dict[str, TokenWorker] = {}
        self.replaced: list[tuple[str, str]] = []

    def respawn(self, new_id: str, old_id: str) -> None:
        self.replaced.append((new_id, old_id))
        self.h.ends[new_id] = self.h.hub.connect(new_id)
        self.tasks.append(asyncio.ensure_future(self._join({new_id: ""})))

    async def _join(self, ids: dict[str, str]) -> None:
        for w in await start_workers(self.h, ids):
            self.workers[w.wid] = w
            self.tasks.append(asyncio.ensure_future(w.run()))

    async def start(self) -> asyncio.Future[None]:
        run = asyncio.ensure_future(self.h.ctl.run())
        await self._join(dict(POOLS))
        return run

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def check_exactly_once(h: Harness, groups: int) -> None:
    ctl = h.ctl
    assert ctl.ledger.groups_trained == groups and ctl.ledger.duplicates == 0
    assert ctl.lost_groups() == []
    for step in h.train_steps:
        for seq in step.seqs:  # a sequence generated again after a death is the same sequence
            assert list(seq.response_ids) == expected_tokens(list(seq.prompt_ids), "policy")


async def test_a_dead_rollout_worker_is_replaced_and_its_jobs_run_elsewhere() -> None:
    c = Cluster(steps=6)
    run = await c.start()
    try:
        victim = None
        while victim is None:  # a rollout worker with jobs in flight (not between steps)
            await asyncio.sleep(0.005)
            victim = next((w for w in ("w-r0", "w-r1") if c.h.ctl.workers[w].jobs), None)
        c.tasks[list(c.workers).index(victim)].cancel()  # the process is gone
        c.h.ctl.worker_died(victim, "process exited with code -9")
        await asyncio.wait_for(run, 30)
    finally:
        await c.close()
    assert c.replaced[0][1] == victim and c.h.ctl.recovery.restarts == 1
    assert c.h.ctl.recovery.redispatched > 0
    check_exactly_once(c.h, 18)


async def test_a_paused_worker_is_declared_dead_and_its_late_results_are_dropped() -> None:
    c = Cluster(steps=6, worker_timeout_s=0.3)
    run = await c.start()
    try:
        await asyncio.sleep(0.05)
        victim = c.workers["w-j0"]
        victim.paused = True  # SIGSTOP
        while c.h.ctl.workers["w-j0"].state != "dead":
            await asyncio.sleep(0.02)
        victim.paused = False  # SIGCONT: it finishes its jobs and reports them, too late
        await asyncio.wait_for(run, 30)
    finally:
        await c.close()
    assert c.replaced and c.replaced[0][1] == "w-j0"
    assert c.h.ctl.ledger.late_results > 0
    check_exactly_once(c.h, 18)


async def test_a_trainer_dying_in_a_step_undoes_the_step() -> None:
    c = Cluster(steps=4)
    run = await c.start()
    try:
        while not c.h.ctl.training.in_flight:  # the harness trainer answers at once, so
            await asyncio.sleep(0)             # catch the step between send and answer
        c.h.ctl.worker_died("w-t", "killed mid-step")
        await asyncio.wait_for(run, 30)
    finally:
        await c.close()
    assert c.h.ctl.recovery.steps_redone == 1
    check_exactly_once(c.h, 12)


async def test_a_worker_that_never_served_stops_the_run() -> None:
    c = Cluster(steps=2)
    run = asyncio.ensure_future(c.h.ctl.run())
    await asyncio.sleep(0.01)
    c.h.ctl.worker_died("w-r0", "process exited with code 1; stderr: ImportError")
    with pytest.raises(WorkerError, match="w-r0.*ImportError"):
        await asyncio.wait_for(run, 5)
    assert c.replaced == []
