"""Which launcher a run uses (``--set launcher=local|ray``) and the controller socket it needs.

The local launcher keeps the controller's socket as configured (a private ipc path by default).
The Ray launcher needs one that every node reaches: TCP on loopback when the whole cluster is
this host, else this host's address with CurveZMQ (see ``RayCluster.controller_endpoint``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pivotflow.config import RunConfig
from pivotflow.launch.base import Launcher
from pivotflow.launch.local import LocalLauncher
from pivotflow.transport.admission import new_run_secret
from pivotflow.transport.curve import CurveKeys
from pivotflow.transport.zmq_transport import ZmqControllerTransport

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller


def open_workers(cfg: RunConfig, curve: CurveKeys | None, log_dir: Path, slots: int,
                 run_tag: str) -> tuple[ZmqControllerTransport, Launcher]:
    """The controller's transport and the launcher for ``slots`` workers; on an error (the
    cluster unreachable, or unable to place them) whatever was opened is closed again."""
    if cfg.launcher != "ray":
        # the run's secret: a Hello without its worker's token is refused (transport/admission)
        secret = new_run_secret()
        transport = ZmqControllerTransport(cfg.endpoint or None, curve=curve,
                                           worker_secret=secret)
        return transport, LocalLauncher(transport.endpoint, log_dir,
                                        threads=cfg.threads_per_worker,
                                        curve_keys=cfg.curve_keys, secret=secret)
    from pivotflow.launch.ray import RayCluster, RayLauncher

    cluster = RayCluster(cfg.ray.address)
    tcp: ZmqControllerTransport | None = None
    try:
        tcp = ZmqControllerTransport(
            cfg.endpoint or cluster.controller_endpoint(cfg.curve_keys), curve=curve)
        gpus = cfg.ray.gpus_per_worker
        if gpus < 0:  # auto: a GPU per worker when the workers run on CUDA
            gpus = 1.0 if cfg.device.startswith("cuda") else 0.0
        launcher = RayLauncher(tcp.endpoint, log_dir, threads=cfg.threads_per_worker,
                               curve_keys=cfg.curve_keys, slots=slots,
                               cpus=cfg.ray.cpus_per_worker, gpus=gpus,
                               strategy=cfg.ray.strategy,
                               place_timeout_s=cfg.ray.place_timeout_s, run_tag=run_tag,
                               cluster=cluster)
    except BaseException:
        if tcp is not None:
            tcp.close()
        cluster.close()
        raise
    return tcp, launcher


def attach(launcher: Launcher, ctl: Controller) -> None:
    """A launcher that places trainers on several hosts gives their groups' addresses."""
    rendezvous = getattr(launcher, "rendezvous", None)
    if rendezvous is not None:
        ctl.training.rendezvous_for = rendezvous


def launcher_summary(launcher: Launcher, cfg: RunConfig) -> dict[str, Any]:
    """The run summary's ``launcher`` key, and ``ray`` (placement, nodes used and lost)."""
    stats = getattr(launcher, "stats", None)
    return {"launcher": cfg.launcher, **({"ray": stats()} if stats is not None else {})}
