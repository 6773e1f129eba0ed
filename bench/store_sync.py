"""A parameter version copied between two nodes' stores (pivotflow/params/node_sync.py), beside
a local memcpy of the same bytes: two processes, each with its own store root, gloo over a
loopback TCP rendezvous (on a real cluster: the network between nodes).

    python bench/store_sync.py [--params 100000000] [--chunk-mb 64] [--repeats 2]

``sync_s``: from the sender's first broadcast to the version published in the receiver's store
(header, chunks, assembly, publish); ``memcpy_s``: one torch copy of the same bytes here.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import socket
import tempfile
import time
from pathlib import Path

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node(rank: int, root: str, port: int, params: int, chunk: int, repeats: int,
         out: mp.Queue) -> None:
    import torch.distributed as dist

    from pivotflow.params.node_sync import VersionSync
    from pivotflow.params.shm_store import ShmParamStore
    from pivotflow.worker.train_group import TrainGroup

    store = ShmParamStore(root)
    TrainGroup().join(1, rank, 2, f"tcp://127.0.0.1:{port}")
    sync = VersionSync(store, chunk_bytes=chunk)
    if rank == 0:  # ~a 100M model: a few large matrices
        g = torch.Generator().manual_seed(0)
        n = params // 4
        store.publish("policy", 1, {f"w{i}": torch.randn(n, generator=g) for i in range(4)},
                      {"model_type": "bench"})
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            sync.send("policy", 1)
        else:
            sync.receive()
        dist.barrier()  # the receiver has published
        out.put((rank, time.perf_counter() - t0))


def measure(params: int = 100_000_000, chunk_mb: int = 64, repeats: int = 2) -> dict:
    """A ``params``-parameter fp32 version sent between two stores (the best of ``repeats``),
    and the best of 3 local copies of the same bytes: the JSON ``main`` prints."""
    nbytes = params * 4
    src = torch.randn(params)
    dst = torch.empty_like(src)
    memcpy = []
    for _ in range(3):
        t0 = time.perf_counter()
        dst.copy_(src)
        memcpy.append(time.perf_counter() - t0)
    del src, dst
    roots = [tempfile.mkdtemp(prefix="pivotflow-bench-node-", dir="/dev/shm") for _ in (0, 1)]
    try:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        port = free_port()
        procs = [ctx.Process(target=node, args=(r, roots[r], port, params, chunk_mb << 20,
                                                repeats, q))
                 for r in (0, 1)]
        for p in procs:
            p.start()
        times = [q.get(timeout=600) for _ in range(2 * repeats)]
        for p in procs:
            p.join(60)
    finally:
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
    sync_s = min(t for rank, t in times if rank == 1)
    return {"bench": "store_sync", "params": params, "bytes": nbytes,
            "chunk_mb": chunk_mb, "transport": "gloo over loopback TCP",
            "sync_s": round(sync_s, 3), "sync_gb_s": round(nbytes / sync_s / 1e9, 3),
            "memcpy_s": round(min(memcpy), 3),
            "memcpy_gb_s": round(nbytes / min(memcpy) / 1e9, 3),
            "sync_over_memcpy": round(sync_s / min(memcpy), 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, default=100_000_000)
    ap.add_argument("--chunk-mb", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    line = json.dumps(measure(args.params, args.chunk_mb, args.repeats))
    if args.out:
        args.out.write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
