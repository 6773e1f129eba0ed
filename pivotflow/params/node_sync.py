"""A parameter version copied from one node's store to the others' (issue 23 part 2, its core).

Every node keeps its own shared-memory store. The node that holds a new version (``src``)
sends it over a process group (gloo on CPU) to one store agent per other node: first a
header (the version's config and each tensor's name, dtype and shape), then the bytes of all
tensors as one stream cut in ``chunk_bytes`` broadcasts. A receiver assembles the stream in its
own memory and publishes the version into its node's store only when the last chunk is in:
``publish`` itself is whole-or-nothing, so a reader on any node never sees a half-sent version,
and a broadcast broken half way (the sender killed) leaves nothing but a WorkerError.

``params/node_agent.py`` runs these broadcasts in a run: one store agent per node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from pivotflow.errors import CheckpointError, WorkerError
from pivotflow.params.shm_store import ShmParamStore

CHUNK_BYTES = 64 << 20  # per broadcast: large enough to amortise a collective, small to buffer

Progress = Callable[[int, int], None]  # (bytes so far, bytes in all)


class VersionSync:
    """This process's end of the version broadcasts in ``group`` (the default group when
    None): rank ``src`` sends, every other rank receives into ``store``."""

    def __init__(self, store: ShmParamStore, *, src: int = 0, group: Any = None,
                 chunk_bytes: int = CHUNK_BYTES) -> None:
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        self.store, self.src, self.group, self.chunk_bytes = store, src, group, chunk_bytes
        self.last_bytes = 0  # of the last version received

    def send(self, model: str, version: int | None = None,
             on_chunk: Progress | None = None) -> int | None:
        """Broadcast ``model@version`` (latest when None) from this rank; the version sent, or
        None when it was collected before it could be held (the receivers are told so)."""
        try:
            held = self.store.acquire(model, version)
        except CheckpointError as exc:
            dist.broadcast_object_list([{"model": model, "skip": str(exc)}], src=self.src,
                                       group=self.group)
            return None
        try:
            tensors = held.tensors
            header = {"model": model, "version": held.version, "config": held.config,
                      "entries": [(k, str(t.dtype).removeprefix("torch."), list(t.shape))
                                  for k, t in tensors.items()]}
            dist.broadcast_object_list([header], src=self.src, group=self.group)
            views = [_bytes_of(t) for t in tensors.values()]
            total = sum(v.numel() for v in views)
            buf = torch.empty(min(self.chunk_bytes, max(total, 1)), dtype=torch.uint8)
            done = 0
            for n in _fill_chunks(views, buf):
                dist.broadcast(buf[:n], src=self.src, group=self.group)
                done += n
                if on_chunk is not None:
                    on_chunk(done, total)
            return held.version
        finally:
            held.release()

    def receive(self, on_chunk: Progress | None = None, *,
                publish: bool = True) -> tuple[str, int] | None:
        """Take the next broadcast whole and publish it into this node's store (unless
        ``publish`` is False: this node has it already); (model, version), or None when the
        sender no longer had it. Raises WorkerError, with nothing published, if it breaks off."""
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=self.src, group=self.group)
        header = box[0]
        if "skip" in header:
            return None
        model, version = header["model"], header["version"]
        shapes = [(name, getattr(torch, dtype), shape) for name, dtype, shape in header["entries"]]
        sizes = [_nbytes(dtype, shape) for _, dtype, shape in shapes]
        total = sum(sizes)
        flat = torch.empty(total, dtype=torch.uint8)
        done = 0
        try:
            while done < total:
                n = min(self.chunk_bytes, total - done)
                dist.broadcast(flat[done:done + n], src=self.src, group=self.group)
                done += n
                if on_chunk is not None:
                    on_chunk(done, total)
        except Exception as exc:  # the sender (or its node) went mid-broadcast
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise WorkerError(f"version broadcast of {model}@v{version} broke off after "
                              f"{done} of {total} bytes ({type(exc).__name__}: {first}); "
                              "nothing was published") from None
        self.last_bytes = total
        if not publish:
            return model, version
        tensors, offset = {}, 0
        for (name, dtype, shape), size in zip(shapes, sizes, strict=True):
            tensors[name] = flat[offset:offset + size].view(dtype).reshape(shape)
            offset += size
        self.store.publish(model, version, tensors, header["config"])
        return model, version


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes as a flat uint8 tensor (a view when ``t`` is contiguous)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def _nbytes(dtype: torch.dtype, shape: list[int]) -> int:
    n = torch.empty((), dtype=dtype).element_size()
    for d in shape:
        n *= d
    return n


def _fill_chunks(views: list[torch.Tensor], buf: torch.Tensor) -> Iterator[int]:
    """Copy the concatenated ``views`` into ``buf`` a chunk at a time; yields each chunk's
    length once ``buf`` holds it."""
    used = 0
    for v in views:
        at = 0
        while at < v.numel():
            n = min(buf.numel() - used, v.numel() - at)
            buf[used:used + n].copy_(v[at:at + n])
            used, at = used + n, at + n
            if used == buf.numel():
                yield used
                used = 0
    if used:
        yield used
