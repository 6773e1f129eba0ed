"""The trainers' group over a TCP rendezvous (what the Ray launcher gives, as trainers may be on
several hosts): rank 0 serves a TCPStore at the given port, the others join it; a new epoch
forms a new group at a new port. Real processes, gloo on loopback; no Ray needed."""

from __future__ import annotations

import multiprocessing as mp
import socket

import pytest
import torch
from spawned import run_spawned

from pivotflow.errors import WorkerError
from pivotflow.worker.train_group import TrainGroup

pytestmark = pytest.mark.timeout(120)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def member(rank: int, ports: list[int], out: mp.Queue) -> None:
    group = TrainGroup()
    results = []
    for epoch, port in enumerate(ports, start=1):
        assert group.join(epoch, rank, 2, f"tcp://127.0.0.1:{port}")
        t = torch.full((3,), float(rank + epoch))
        group.all_reduce_sum([t])
        b = torch.full((2,), float(rank * 10 + epoch))
        group.broadcast([b])
        results.append((t.tolist(), b.tolist()))
    group.leave()
    out.put((rank, results))


def test_two_trainers_meet_over_tcp_and_reform_at_a_new_port() -> None:
    ports = [free_port(), free_port()]
    got = dict(run_spawned(member, [(r, ports) for r in (0, 1)]))
    for rank in (0, 1):  # sums over both ranks; rank 0's tensor broadcast
        assert got[rank] == [([3.0] * 3, [1.0] * 2), ([5.0] * 3, [2.0] * 2)]


def test_a_malformed_tcp_rendezvous_is_a_worker_error() -> None:
    with pytest.raises(WorkerError, match="trainer group epoch 1 .* is not tcp://HOST:PORT"):
        TrainGroup().join(1, 1, 2, "tcp://127.0.0.1")
