"""What every Global Parameter Storage backend offers, and how the multi-machine one will work.

Backends: ``DirectoryParamStore`` (store.py; safetensors files in a folder, the first backend) and
``ShmParamStore`` (shm_store.py; one flat buffer per version in host shared memory, zero-copy
loads, versions held by kernel file locks). A run switches backend by constructing the other one.
``DirectoryParamStore`` has no ``acquire``; it satisfies ``ParamStore`` only in its other methods.

What a version holds is engine-neutral: tensors under their Hugging Face names, with their shapes
and dtypes as published, and the model's config as plain data (``dict``: what its ``config.json``
holds). Each reader builds its own model description from that dict (the torch engine's
``config_from_hf``; vLLM and SGLang read the same dict from an exported folder), so the store
imports no engine and a model the embedded engine cannot run still travels through it.
A trainer publishes every new version with the dict it loaded; an optimizer-state set
(``policy.optim``) carries its model's dict too. Importing this module loads no torch: the
controller names ``ParamStore`` in its types without paying for it.

Across machines (``params/node_agent.py``, ``params/node_sync.py``; started by the Ray launcher)
each node keeps its own ``ShmParamStore`` and workers read only their local one, so the reader
path (acquire/load/load_into, held versions, gc) is unchanged and stays zero-copy. One store
agent per node (a Ray actor) joins a gloo group with the others; in rounds they gather each
other's inventories and broadcast the versions a node lacks as one flat buffer in fixed chunks
(one collective per chunk, never one per tensor, which is why a version is a single flat
buffer), published there only when whole. A trainer reports its step once its version is on
every node (``wait_crossed``); weights never cross the controller's socket. gc stays per node.
NCCL (a GPU source staged through a device buffer) is not built: on GPUs the agents still send
host memory over gloo.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from pivotflow.errors import CheckpointError

if TYPE_CHECKING:  # annotations only: the control plane imports this module without torch
    import torch

HFConfig = dict[str, Any]  # a model's Hugging Face config.json, as data


class HeldParams(Protocol):
    """One version kept readable (never collected) until ``release`` — and, for a zero-copy
    backend, until every tensor view taken from it is gone too."""

    model: str
    version: int
    config: HFConfig
    tensors: dict[str, torch.Tensor]

    def release(self) -> None:
        """Drop this hold (idempotent)."""
        ...

    def __enter__(self) -> HeldParams: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class ParamStore(Protocol):
    """Named, versioned parameter sets (``policy@7``, ``judge@0``, ``policy.optim@7``)."""

    @property
    def root(self) -> Path:
        """Where this machine's copy lives; workers open the same store from it."""
        ...

    def publish(
        self, model: str, version: int, tensors: dict[str, torch.Tensor], config: HFConfig
    ) -> None:
        """Write ``model@version`` whole, then make it visible; raises CheckpointError (also for
        a ``config`` that is not a dict of JSON data)."""
        ...

    def latest(self, model: str) -> int:
        """The newest published version; raises CheckpointError when there is none."""
        ...

    def versions(self, model: str) -> list[int]:
        """Every visible version of ``model``, oldest first (empty when there is none)."""
        ...

    def load(
        self, model: str, version: int | None = None
    ) -> tuple[int, HFConfig, dict[str, torch.Tensor]]:
        """(version, config, tensors) of ``model@version`` (latest when None); raises
        CheckpointError when it is missing or unreadable."""
        ...

    def acquire(self, model: str, version: int | None = None) -> HeldParams:
        """Hold ``model@version`` (latest when None) so gc leaves it alone; raises
        CheckpointError when it is missing or unreadable."""
        ...

    def gc(self, model: str, keep: int = 2) -> list[int] | None:
        """Delete versions older than the ``keep`` newest that nobody holds."""
        ...


# a reader's wait for a version published on another node to reach this one's store
VERSION_WAIT_S = 60.0


def load_newer(store: ParamStore, model: str, min_version: int, load: Callable[[], int],
               wait_s: float = VERSION_WAIT_S) -> int:
    """For a reader asked for ``model@min_version`` or newer (a rollout engine, a critic):
    wait up to ``wait_s`` for the store to hold it (on a cluster its store agent publishes it
    here when whole; better to wait than load an older one), then ``load()`` the newest, which
    returns the version it loaded (read again if the store collects it between LATEST and the
    read). Returns that version; raises CheckpointError if it is still older."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and _latest(store, model) < min_version:
        time.sleep(0.01)
    for attempt in range(3):
        try:
            version = load()
            break
        except CheckpointError:
            if attempt == 2:
                raise
            time.sleep(0.05)
    if version < min_version:
        raise CheckpointError(f"{model}@v{min_version} was asked for but the store's latest "
                              f"is v{version}")
    return version


def _latest(store: ParamStore, model: str) -> int:
    try:
        return store.latest(model)
    except CheckpointError:  # nothing there yet
        return -1
