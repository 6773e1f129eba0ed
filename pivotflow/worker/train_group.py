"""The trainers' data-parallel group: gloo on CPU, re-formed whenever the pool's membership
changes (a new ``epoch``), which only happens between optimizer steps.

Each epoch rendezvouses at its own FileStore path, so a worker that left never meets a stale
group. On a new epoch rank 0 broadcasts the weights and the optimizer state, so a trainer that
just joined starts from exactly the state the pool had, whatever it loaded itself.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from pivotflow.errors import WorkerError

RENDEZVOUS_TIMEOUT_S = 60.0


class TrainGroup:
    """This process's membership in the trainers' group (none while it trains alone)."""

    def __init__(self) -> None:
        self.epoch = -1
        self.world = 1
        self.rank = 0

    def join(self, epoch: int, rank: int, world: int, rendezvous: str) -> bool:
        """Be rank ``rank`` of ``world`` for ``epoch``; True when a new group was formed (the
        caller then syncs state from rank 0). Raises WorkerError when the rendezvous fails."""
        if epoch == self.epoch and world == self.world:
            return False
        self.leave()
        self.epoch, self.world, self.rank = epoch, world, rank
        if world == 1:
            return False
        if not rendezvous:
            raise WorkerError(f"train step for {world} trainers came without a rendezvous path")
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback: the trainers share a host
        try:
            store = dist.FileStore(rendezvous, world)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                    timeout=timedelta(seconds=RENDEZVOUS_TIMEOUT_S))
        except Exception as exc:  # a peer that never came: name the group, not a gloo trace
            self.epoch, self.world = -1, 1
            raise WorkerError(f"trainer group epoch {epoch} (rank {rank} of {world}) at "
                              f"{rendezvous}: {exc}") from exc
        return True

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        self.epoch, self.world, self.rank = -1, 1, 0

    def broadcast(self, tensors: list[torch.Tensor]) -> None:
        """Overwrite ``tensors`` on every rank with rank 0's, in one collective per dtype."""
        if self.world == 1:
            return
        for group in _by_dtype(tensors):
            flat = torch.cat([t.reshape(-1) for t in group])
            dist.broadcast(flat, src=0)
            offset = 0
            for t in group:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()

    def all_reduce_sum(self, tensors: list[torch.Tensor]) -> None:
        """Sum ``tensors`` over the ranks in place (gradients, statistics), one collective."""
        if self.world == 1 or not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def _by_dtype(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return list(groups.values())
