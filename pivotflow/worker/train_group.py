"""The trainers' data-parallel group: gloo on CPU, re-formed whenever the pool's membership
changes (a new ``epoch``), which only happens between optimizer steps.

Each epoch rendezvouses at its own address, so a worker that left never meets a stale group:
a FileStore path when every trainer is on the controller's host (the local launcher: no port to
pick, nothing on the network), or ``tcp://HOST:PORT`` on rank 0's node when the trainers may be
on several (the Ray launcher picks a port free there; rank 0 serves a TCPStore at it and the
other ranks connect, and gloo then talks over the interface that reaches rank 0). On a new
epoch rank 0 broadcasts the weights and the optimizer state, so a trainer that
just joined starts from exactly the state the pool had, whatever it loaded itself.
"""

from __future__ import annotations

import os
import socket
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
        self.store: dist.Store | None = None  # rank 0's serves the group's TCP rendezvous

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
        try:
            self.store = _rendezvous_store(rendezvous, rank, world)
            dist.init_process_group("gloo", store=self.store, rank=rank, world_size=world,
                                    timeout=timedelta(seconds=RENDEZVOUS_TIMEOUT_S))
        except Exception as exc:  # a peer that never came: name the group, not a gloo trace
            self.epoch, self.world, self.store = -1, 1, None
            raise WorkerError(f"trainer group epoch {epoch} (rank {rank} of {world}) at "
                              f"{rendezvous}: {exc}") from exc
        return True

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        self.epoch, self.world, self.rank, self.store = -1, 1, 0, None

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


def _rendezvous_store(rendezvous: str, rank: int, world: int) -> dist.Store:
    timeout = timedelta(seconds=RENDEZVOUS_TIMEOUT_S)
    if not rendezvous.startswith("tcp://"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback: the trainers share a host
        return dist.FileStore(rendezvous, world)
    host, _, port = rendezvous[len("tcp://"):].rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise WorkerError(f"trainer rendezvous {rendezvous!r} is not tcp://HOST:PORT")
    ifname = _interface_towards(host)
    if ifname:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", ifname)
    return dist.TCPStore(host, int(port), world, is_master=rank == 0, timeout=timeout,
                         wait_for_workers=False)


def _interface_towards(host: str) -> str:
    """The name of this host's network interface that reaches ``host`` (gloo binds its pairs
    there; left to itself it takes the hostname's address, which may not be routable); "" when
    it cannot tell (gloo's own choice then, or the user's GLOO_SOCKET_IFNAME)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # a UDP connect sends nothing: it only picks the route
        local = s.getsockname()[0]
    if local.startswith("127.") or local == "::1":
        return "lo"
    import fcntl
    import struct

    siocgifaddr = 0x8915
    for _, name in socket.if_nameindex():
        if family != socket.AF_INET:
            break  # no ioctl for v6 addresses: gloo's own choice then
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(s.fileno(), siocgifaddr,
                                     struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        if socket.inet_ntoa(packed[20:24]) == local:
            return name
    return ""


def _by_dtype(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return list(groups.values())
