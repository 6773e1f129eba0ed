"""Which launcher a run uses (``--set launcher=local|ray``) and the controller socket it needs.

The local launcher keeps the controller's socket as configured (a private ipc path by default).
The Ray launcher needs one that every node reaches: TCP on loopback when the whole cluster is
this host, else this host's address with CurveZMQ (see ``RayCluster.controller_endpoint``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pivotflow.launch.base import Launcher
from pivotflow.launch.launcher_config import LauncherConfig
from pivotflow.launch.local import LocalLauncher, local_gpu_slots
from pivotflow.transport.admission import new_run_secret
from pivotflow.transport.curve import CurveKeys
from pivotflow.transport.endpoints import is_loopback_tcp
from pivotflow.transport.transport_config import TransportConfig
from pivotflow.transport.zmq_transport import ZmqControllerTransport

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller


def open_workers(lc: LauncherConfig, tc: TransportConfig, curve: CurveKeys | None,
                 log_dir: Path, slots: int,
                 run_tag: str) -> tuple[ZmqControllerTransport, Launcher]:
    """The controller's transport (``curve``: its keys, loaded from ``tc.curve_keys``) and the
    launcher for ``slots`` workers; on an error (the cluster unreachable, or unable to place
    them) whatever was opened is closed again."""
    if lc.kind != "ray":
        # the run's secret: a Hello without its worker's token is refused (transport/admission)
        secret = new_run_secret()
        transport = ZmqControllerTransport(tc.endpoint or None, curve=curve,
                                           worker_secret=secret)
        try:
            slots_of_gpus = local_gpu_slots(lc, slots)
        except BaseException:
            transport.close()
            raise
        return transport, LocalLauncher(transport.endpoint, log_dir, threads=lc.threads,
                                        curve_keys=tc.curve_keys, secret=secret,
                                        gpu_slots=slots_of_gpus, fork=lc.forks_workers())
    from pivotflow.launch.ray import RayCluster, RayLauncher

    cluster = RayCluster(lc.ray.address)
    tcp: ZmqControllerTransport | None = None
    secret_file = ""
    try:
        endpoint = tc.endpoint or cluster.controller_endpoint(tc.curve_keys)
        ray_secret: bytes | None = None
        if is_loopback_tcp(endpoint):
            # Every node is this host: the secret goes in a 0600 file here that the host
            # actors read (its path travels through Ray, never its bytes). Across hosts the
            # CurveZMQ keys, required there, are what admits a worker.
            ray_secret = new_run_secret()
            fd, secret_file = tempfile.mkstemp(prefix=f"pivotflow-run-secret-{run_tag}-")
            with os.fdopen(fd, "wb") as f:
                f.write(ray_secret)
        tcp = ZmqControllerTransport(endpoint, curve=curve, worker_secret=ray_secret)
        launcher = RayLauncher(tcp.endpoint, log_dir, threads=lc.threads,
                               curve_keys=tc.curve_keys, slots=slots,
                               cpus=lc.ray.cpus_per_worker, gpus=lc.worker_gpus(),
                               strategy=lc.ray.strategy,
                               place_timeout_s=lc.ray.place_timeout_s, run_tag=run_tag,
                               cluster=cluster, secret_file=secret_file)
    except BaseException:
        if tcp is not None:
            tcp.close()
        if secret_file:
            Path(secret_file).unlink(missing_ok=True)
        cluster.close()
        raise
    return tcp, launcher


def attach(launcher: Launcher, ctl: Controller) -> None:
    """A launcher that places trainers on several hosts gives their groups' addresses, and
    one that places workers on several nodes gives each its node's store."""
    share_store = getattr(launcher, "share_store", None)
    if share_store is not None:  # a store copy per node: each worker reads its node's
        share_store(ctl.store_dir)
    ctl.use_placement(launcher.store_dir_for if share_store is not None  # type: ignore[attr-defined]
                      else None, getattr(launcher, "rendezvous", None))


def launcher_summary(launcher: Launcher, lc: LauncherConfig) -> dict[str, Any]:
    """The run summary's ``launcher`` key, and ``ray`` (placement, nodes used and lost) or
    ``local_gpus`` (which GPUs each worker was given, when the local launcher gave any)."""
    stats = getattr(launcher, "stats", None)
    if lc.kind == "ray" and stats is not None:
        return {"launcher": lc.kind, "ray": stats()}
    given = getattr(launcher, "gpus_given", None)
    return {"launcher": lc.kind, **({"local_gpus": given} if given else {})}
