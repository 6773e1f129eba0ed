"""Optimizer steps: when one starts, how its batch is split over the trainer pool, and when it
is done.

The trainer pool is resized only between steps: a step starts when a batch is ready and no
trainer is still loading, and it uses every ready trainer as one data-parallel group (rank 0
first among the trainers that took the last step, so it holds the newest state). A change of
membership is a new ``epoch`` with a fresh rendezvous path; when nobody of the last step is
left, rank 0 first takes the policy and optimizer state from the parameter store.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from pivotflow.controller import stages
from pivotflow.controller.sample import Sample
from pivotflow.controller.train_tokens import (
    carries_signal,
    scale_by_batch_std,
    seq_tokens,
    valid_tokens,
    whiten_token_advantages,
)
from pivotflow.protocol import TrainDone, TrainSeq, TrainStep

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller


def shards(seqs: list[TrainSeq], n: int) -> list[list[TrainSeq]]:
    """``seqs`` in ``n`` contiguous, non-empty parts of near-equal token counts."""
    n = max(1, min(n, len(seqs)))
    total = sum(map(seq_tokens, seqs))
    parts: list[list[TrainSeq]] = [[] for _ in range(n)]
    acc, k = 0, 0
    for i, s in enumerate(seqs):
        left = len(seqs) - i  # keep one sequence for every part still empty
        if k < n - 1 and parts[k] and (acc >= total * (k + 1) / n or left <= n - 1 - k):
            k += 1
        parts[k].append(s)
        acc += seq_tokens(s)
    return parts


def mini_batch_shards(seqs: list[TrainSeq], k: int, world: int
                      ) -> tuple[list[list[TrainSeq]], list[list[int]], list[int], list[int]]:
    """``seqs`` cut into ``k`` contiguous mini-batches of near-equal counts, each sharded over
    the ranks (as many as the smallest mini-batch has sequences, at most ``world``): each
    rank's sequences (its shard of every mini-batch, in order), how many of them each
    mini-batch holds, and each mini-batch's valid tokens and sequences. A mini-batch is the
    same sequences whatever the number of ranks, so a step is the same on one trainer or four."""
    k = max(1, min(k, len(seqs)))
    bounds = [round(i * len(seqs) / k) for i in range(k + 1)]
    parts = [seqs[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    ranks = max(1, min(world, min(len(p) for p in parts)))
    rank_seqs: list[list[TrainSeq]] = [[] for _ in range(ranks)]
    sizes: list[list[int]] = [[] for _ in range(ranks)]
    for part in parts:
        for r, shard in enumerate(shards(part, ranks)):
            rank_seqs[r] += shard
            sizes[r].append(len(shard))
    tokens = [sum(valid_tokens(s) for s in p) for p in parts]
    counted = [sum(1 for s in p if valid_tokens(s) > 0) for p in parts]
    return rank_seqs, sizes, tokens, counted


class TrainSteps:
    """The controller's side of training: one step in flight at a time."""

    def __init__(self, ctl: Controller, pool: str, rendezvous_dir: str) -> None:
        self.ctl = ctl
        self.pool = pool
        self.rendezvous_dir = rendezvous_dir
        train = ctl.order[-1]
        self.whiten = bool(train.options.get("whiten_advantages", True))
        self.batch_std = bool(train.options.get("batch_std", False))
        self.mini_batches = int(train.options.get("mini_batches", 1))
        # (rank 0's worker id, epoch) -> the group's address, set by a launcher whose trainers
        # may be on several hosts (Ray: tcp:// on rank 0's node); else a FileStore path here
        self.rendezvous_for: Callable[[str, int], str] | None = None
        self.batch: list[list[Sample]] | None = None  # the step in flight
        self.waiting: set[str] = set()  # trainers whose shard is not done yet
        self.rank0_msg: TrainDone | None = None
        self.members: list[str] = []  # trainers of the last step, rank order
        self.member_roles: list[int] = []  # their ``roles_taken`` then
        self.epoch = 0
        self.started_at = 0.0
        self.planned_for = -1  # the step the planner was last asked to size the trainers for
        self.batch_samples = 0  # samples in ``batch`` (the planner asks every interval)
        self.batch_tokens = 0  # and their tokens, prompts and responses
        self.last_tokens_per_sample = 0.0  # of the last step trained
        # trainers -> (tokens, step seconds) over the steps trained at that size: a rate in
        # tokens, as a step's time goes with its tokens, so that sizes measured on short
        # samples still say how long a step of longer ones takes (``planning.planner_view``
        # turns it into samples/s at the samples waiting)
        self.by_size: dict[int, tuple[int, float]] = {}
        self.first_started_at: float | None = None  # the run's first step began then
        self.stepping_s = 0.0  # seconds some step ran since (the planner's trainer busy share)

    def use_rendezvous(self, rendezvous_for: Callable[[str, int], str]) -> None:
        """Trainers' groups meet where the launcher says (rank 0's node), not in a file here."""
        self.rendezvous_for = rendezvous_for

    @property
    def in_flight(self) -> bool:
        return self.batch is not None

    def maybe_start(self) -> None:
        ctl = self.ctl
        if self.batch is not None or ctl.version >= ctl.cfg.steps:
            return
        if not ctl.train_buffer.can_take(ctl.version):
            return
        if self.planned_for != ctl.version:  # a batch is ready: the planner may add trainers
            self.planned_for = ctl.version
            ctl.plan_once(pump=False)
        workers = [ctl.workers[w] for w in ctl.pools[self.pool].workers]
        if not workers or any(w.state != "ready" for w in workers):
            return  # resize first: a joining trainer takes part in the next step
        batch = ctl.train_buffer.take(ctl.version)
        if batch is None:
            return
        seqs = [stages.train_seq(s) for group in batch for s in group]
        if self.whiten:
            whiten_token_advantages(seqs)
        if self.batch_std:
            scale_by_batch_std(seqs, [s.fields.get("reward") for group in batch for s in group])
        # Rank 0 is a trainer that took the last step and never left since: it holds the
        # newest weights and optimizer state. With none such, rank 0 reads them from the store.
        last = dict(zip(self.members, self.member_roles, strict=True))
        here = {w.worker_id: w.roles_taken for w in workers}
        # in the last step's rank order, so that the same trainers keep the same group
        stayed = [m for m in self.members if m in here and last[m] == here[m]]
        order = stayed + [w.worker_id for w in workers if w.worker_id not in stayed]
        sizes: list[list[int]] = []
        part_tokens: list[int] = []
        part_seqs: list[int] = []
        if self.mini_batches > 1:  # several updates: each rank's part of every mini-batch
            parts, sizes, part_tokens, part_seqs = mini_batch_shards(seqs, self.mini_batches,
                                                                     len(order))
        else:
            parts = shards(seqs, len(order))
        order = order[: len(parts)]
        roles = [ctl.workers[w].roles_taken for w in order]
        # rank 0 publishes weights and optimizer state every step, so from version 1 on the
        # store holds what a rank 0 that did not take the last step needs
        optim_version = ctl.version if ctl.version > 0 and order[0] not in stayed else -1
        # A member that left and came back has a new role and no group: a new epoch (with a
        # fresh rendezvous path, never one an old group wrote to).
        if order != self.members or roles != self.member_roles:
            self.epoch += 1
        self.members, self.member_roles = order, roles
        self.batch, self.waiting, self.rank0_msg = batch, set(order), None
        self.batch_samples = len(seqs)
        self.batch_tokens = sum(map(seq_tokens, seqs))
        self.started_at = ctl.clock.now()
        if self.first_started_at is None:
            self.first_started_at = self.started_at
        rendezvous = ""
        if len(order) > 1:
            rendezvous = (self.rendezvous_for(order[0], self.epoch) if self.rendezvous_for
                          else os.path.join(self.rendezvous_dir, f"trainers-epoch{self.epoch}"))
        total_tokens = sum(valid_tokens(s) for s in seqs)
        total_seqs = sum(1 for s in seqs if valid_tokens(s) > 0)
        any_signal = carries_signal(seqs)
        for rank, (wid, part) in enumerate(zip(order, parts, strict=True)):
            ctl.workers[wid].set_training(True)
            ctl.send(wid, TrainStep(
                step=ctl.version, seqs=part, rank=rank, world=len(order), epoch=self.epoch,
                rendezvous=rendezvous,
                optim_version=optim_version if rank == 0 else -1, total_tokens=total_tokens,
                total_seqs=total_seqs, any_signal=any_signal,
                part_sizes=sizes[rank] if sizes else [], part_tokens=part_tokens,
                part_seqs=part_seqs))

    def on_done(self, worker_id: str, msg: TrainDone) -> tuple[list[list[Sample]], TrainDone] | None:
        """A shard finished; the whole step when it was the last one (else None)."""
        ctl = self.ctl
        ctl.workers[worker_id].set_training(False)
        if self.batch is None or msg.step != ctl.version or worker_id not in self.waiting:
            ctl.ledger.count_late()
            return None
        self.waiting.discard(worker_id)
        if msg.rank == 0:
            self.rank0_msg = msg
        if self.waiting:
            return None
        batch, self.batch, self.batch_samples = self.batch, None, 0
        # the pool's rate for the planner: samples per busy trainer-second
        took = ctl.clock.now() - self.started_at
        self.stepping_s += took
        done = sum(len(g) for g in batch)
        ctl.jobs.trained(self.pool, took * len(self.members), done)
        # and per number of trainers: data parallel is far from linear on small batches
        tokens, secs = self.by_size.get(len(self.members), (0, 0.0))
        self.by_size[len(self.members)] = (tokens + self.batch_tokens, secs + took)
        self.last_tokens_per_sample = self.batch_tokens / max(done, 1)
        assert self.rank0_msg is not None  # rank 0 is always among the shards
        return batch, self.rank0_msg

    def on_worker_lost(self, worker_id: str) -> list[str] | None:
        """A worker died. If it was in the running step, undo the step (its batch goes back to
        the buffer, the next step starts a new group) and return the step's other trainers
        that may be blocked in a collective with it (they must be restarted); else None."""
        if self.batch is None or worker_id not in self.members:
            return None
        self.ctl.train_buffer.requeue(self.batch)
        blocked = sorted(self.waiting - {worker_id}) if len(self.members) > 1 else []
        for wid in self.waiting:
            self.ctl.workers[wid].set_training(False)
        self.batch, self.waiting, self.rank0_msg = None, set(), None
        self.batch_samples = 0
        self.members, self.member_roles = [], []
        return blocked

    def busy_share(self, now: float) -> float:
        """Share of the time since the first step began that a step was running (0 before)."""
        if self.first_started_at is None or now <= self.first_started_at:
            return 0.0
        running = now - self.started_at if self.batch is not None else 0.0
        return min(1.0, (self.stepping_s + running) / (now - self.first_started_at))

    def samples(self) -> list[Sample]:
        return [s for group in self.batch or [] for s in group]
