"""A version crossing between two nodes' stores (two store roots, one process per "node",
gloo on loopback over a TCP rendezvous): it arrives whole, bit for bit, in its dtypes; a
broadcast whose sender is killed half way leaves nothing visible on the receiver. No Ray."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.timeout(180)

CONFIG = {"model_type": "qwen2", "hidden_size": 8}


def weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {"embed.weight": torch.randn(50, 8, generator=g),
            "layer.0.norm": torch.randn(8, generator=g).to(torch.bfloat16),
            "lm_head.weight": torch.randn(50, 8, generator=g),
            "step": torch.tensor([3], dtype=torch.int64)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node(rank: int, root: str, port: int, die_at: float, out: mp.Queue) -> None:
    from pivotflow.errors import WorkerError
    from pivotflow.params.node_sync import VersionSync
    from pivotflow.params.shm_store import ShmParamStore
    from pivotflow.worker.train_group import TrainGroup

    store = ShmParamStore(root)
    TrainGroup().join(1, rank, 2, f"tcp://127.0.0.1:{port}")
    sync = VersionSync(store, chunk_bytes=512)  # many chunks for a small version

    def maybe_die(done: int, total: int) -> None:
        if done >= die_at * total:
            os.kill(os.getpid(), signal.SIGKILL)  # the sender's node goes mid-broadcast

    if rank == 0:
        store.publish("policy", 3, weights(), CONFIG)
        out.put(("sent", sync.send("policy", on_chunk=maybe_die if die_at < 1 else None)))
        return
    try:
        out.put(("received", sync.receive()))
    except WorkerError as exc:
        out.put(("error", str(exc)))
    out.put(("versions", store.versions("policy")))


@pytest.fixture
def roots() -> Iterator[list[Path]]:
    """Two nodes' store roots (shared memory is RAM: removed after)."""
    made = [Path(tempfile.mkdtemp(prefix="pivotflow-node-", dir="/dev/shm")) for _ in (0, 1)]
    yield made
    for root in made:
        shutil.rmtree(root, ignore_errors=True)


def run_nodes(roots: list[Path], die_at: float) -> dict[str, object]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=node, args=(r, str(roots[r]), port, die_at, q))
             for r in (0, 1)]
    for p in procs:
        p.start()
    got: dict[str, object] = {}
    want = 2 if die_at < 1 else 3
    while len(got) < want:
        kind, value = q.get(timeout=120)
        got[kind] = value
    for p in procs:
        p.join(30)
    return got


def test_a_version_crosses_to_another_nodes_store_whole(roots: list[Path]) -> None:
    from pivotflow.params.shm_store import ShmParamStore

    got = run_nodes(roots, die_at=1.0)
    assert got["sent"] == 3 and got["received"] == ("policy", 3) and got["versions"] == [3]
    version, config, tensors = ShmParamStore(roots[1]).load("policy")
    assert version == 3 and config == CONFIG
    want = weights()
    assert list(tensors) == list(want)
    for name, t in want.items():
        assert tensors[name].dtype == t.dtype and torch.equal(tensors[name], t), name


def test_a_broadcast_killed_half_way_is_never_visible(roots: list[Path]) -> None:
    from pivotflow.params.shm_store import ShmParamStore

    got = run_nodes(roots, die_at=0.5)
    assert "sent" not in got
    assert "broke off after" in str(got["error"]) and "nothing was published" in str(got["error"])
    assert got["versions"] == [] and ShmParamStore(roots[1]).versions("policy") == []
    assert not (roots[1] / "policy").exists()  # not even a staging folder


def node_that_has_it_or_lost_it(rank: int, root: str, port: int, out: mp.Queue) -> None:
    """Rank 0 sends v3, then v9 that it does not hold (collected before it was held); rank 1
    has v3 already (lets it pass) and is told v9 is not coming."""
    from pivotflow.params.node_sync import VersionSync
    from pivotflow.params.shm_store import ShmParamStore
    from pivotflow.worker.train_group import TrainGroup

    store = ShmParamStore(root)
    TrainGroup().join(1, rank, 2, f"tcp://127.0.0.1:{port}")
    sync = VersionSync(store, chunk_bytes=512)
    if rank == 0:
        store.publish("policy", 3, weights(), CONFIG)
        out.put(("sent", [sync.send("policy", 3), sync.send("policy", 9)]))
        return
    out.put(("received", [sync.receive(publish=False), sync.receive()]))
    out.put(("versions", store.versions("policy")))


def test_a_node_that_has_it_lets_it_pass_and_a_lost_version_is_skipped(
        roots: list[Path]) -> None:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=node_that_has_it_or_lost_it, args=(r, str(roots[r]), port, q))
             for r in (0, 1)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=120) for _ in range(3))
    for p in procs:
        p.join(30)
    assert got["sent"] == [3, None]  # v9: a skip header, no bytes
    assert got["received"] == [("policy", 3), None]
    assert got["versions"] == []  # it let v3 pass (publish=False): nothing published
