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

Design note: the torch.distributed backend (a later step; not built yet)
-------------------------------------------------------------------------
Across machines each machine keeps its own ``ShmParamStore``; workers read only their local one,
so the reader path (acquire/load/load_into, held versions, gc) is unchanged and stays zero-copy.
One *store agent* per machine (a thread in the first worker there, or a small process) joins a
dedicated process group (gloo over TCP for host memory; NCCL when the source sits on a GPU and
each agent stages through one device buffer). A publish on the trainer's machine then:

1. writes the version locally as today (one flat buffer + msgspec index);
2. broadcasts the index bytes (a uint8 tensor, length first) from the publishing rank, then the
   flat buffer itself, in fixed chunks (say 64 MiB) so network and local writes overlap — one
   collective per chunk, never one per tensor, which is why a version is a single flat buffer;
3. each agent writes the received chunks straight into a claimed spare/tmp buffer file of its
   store (``torch.frombuffer`` on the file's shared mapping is the ``broadcast`` destination),
   then renames the version visible and moves its LATEST, exactly as a local publish does;
4. agents ack ``model@version`` to the controller over the existing socket (a few bytes; weights
   never cross it), and the controller only asks for ``min_version`` once a machine has acked.

gc stays per machine (each store knows its own holders); a version is collected on a machine
when nobody there holds it. A dead agent is a dead worker: the controller restarts it and it
catches up by asking the publishing rank for LATEST only, not for the missed history.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

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
