"""The launcher's settings, typed: which launcher starts the workers and what each is given.

``RunConfig`` keeps them as flat ``--set`` keys (``launcher``, ``threads_per_worker``,
``ray.*``: the names the run records carry) and composes this from them
(``RunConfig.launcher_config``); ``launch/workers.open_workers`` takes it.
"""

from __future__ import annotations

import msgspec

from pivotflow import defaults

LAUNCHERS = ("local", "ray")
RAY_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
# how the local launcher starts a worker: forked from its zygote, exec'd afresh, or auto (fork on
# CPU; a GPU run execs, as fork has not been run beside CUDA yet: launch/zygote.py)
WORKER_STARTS = ("auto", "fork", "exec")


class RayConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``launcher=ray``: which cluster (``auto``: the one ``ray start`` left on this host, or
    HOST:PORT of its GCS), what each worker's placement bundle reserves (``gpus_per_worker``
    -1: one GPU when ``device`` is cuda, else none), how bundles spread over nodes, and how
    long to wait for the cluster to place them."""

    address: str = "auto"
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = -1.0
    strategy: str = "PACK"
    place_timeout_s: float = 60.0


class LauncherConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where worker processes start (``kind``, one of LAUNCHERS), with how many torch threads,
    on what device, with how many GPUs each (``gpus_per_worker``: a Ray bundle reserves them;
    the local launcher hands each worker its own of ``gpus``, this host's GPU ids, "" for every
    one it has). The CurveZMQ keys the workers load are the transport's
    (``TransportConfig.curve_keys``)."""

    kind: str = "local"
    threads: int = defaults.THREADS_PER_WORKER
    device: str = defaults.DEVICE
    gpus_per_worker: float = -1.0
    gpus: str = ""
    worker_start: str = "auto"
    ray: RayConfig = msgspec.field(default_factory=RayConfig)

    def forks_workers(self) -> bool:
        """Whether the local launcher forks its workers from a zygote (``worker_start``)."""
        if self.worker_start == "auto":
            return self.device == "cpu"
        return self.worker_start == "fork"

    def worker_gpus(self) -> float:
        """GPUs a worker holds: ``ray.gpus_per_worker`` (Ray's own, kept from before there was
        one for both launchers) or ``gpus_per_worker`` as given, else (-1, auto) one when the
        workers run on CUDA, none on CPU."""
        if self.kind == "ray" and self.ray.gpus_per_worker >= 0:
            return self.ray.gpus_per_worker
        if self.gpus_per_worker >= 0:
            return self.gpus_per_worker
        return 1.0 if self.device.startswith("cuda") else 0.0
