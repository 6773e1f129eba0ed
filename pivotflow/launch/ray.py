"""Worker processes on a Ray cluster: Ray places them, the controller talks to them over ZeroMQ.

``--set launcher=ray [--set ray.address=auto|HOST:PORT]``. One placement group per run, one
bundle per worker (``{"CPU": c}``, plus ``{"GPU": g}`` on GPUs); each worker gets a small host
actor (``launch/ray_host.py``) scheduled into its bundle, which starts the unchanged
``python -m pivotflow.worker`` on that node and reports its exit. Bundles are handed out in a
stable order, by (node IP, GPU id), as slime and verl order theirs. The interface is the local
launcher's, so chaos kills, recovery and respawn work unchanged: a worker whose node vanished
is reported exited (code -9) with the reason as its stderr tail, and its replacement waits for
Ray to re-place the bundle on a node that remains.

With ``share_store`` (``launch/workers.attach`` calls it) every node holding workers gets a
store agent and its own copy of the parameter store (``launch/ray_stores.py``); a worker's
``Welcome`` names its node's copy (``store_dir_for``).
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pivotflow.errors import ConfigError
from pivotflow.launch.ray_address import check_reachable

NODE_LOST_CODE = -9  # the process went with its node (or its host actor): as if SIGKILLed
MAX_LOG_BYTES = 1 << 20  # of each worker's log, copied to the run folder
CALL_TIMEOUT_S = 10.0  # for one call to a host actor on a live node
SUSPECT_CHECK_S = 0.5  # between asks whether a node whose actor died has been declared dead


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("--set launcher=ray: ray is not installed "
                          "(pip install 'pivotflow[ray]')") from None
    return ray


class RayCluster:
    """This process's connection to the cluster (``close`` drops it if it made it)."""

    def __init__(self, address: str) -> None:
        ray = import_ray()
        self.address = address
        self.owned = not ray.is_initialized()  # a caller (a test) may have connected already
        if not self.owned:
            return
        if address.startswith("ray://"):
            raise ConfigError(f"--set ray.address={address}: Ray Client addresses are not "
                              "supported; run on a cluster node and give auto or its GCS "
                              "HOST:PORT")
        if address != "auto":
            check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=False)
        except ConnectionError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"--set ray.address={address}: no Ray cluster there ({first})") \
                from None

    def controller_endpoint(self, curve_keys: str) -> str:
        """Where the controller listens: loopback when every node is this host; else this
        host's address, which needs CurveZMQ keys (a reachable socket without them would take
        frames from anyone)."""
        import ray

        here = ray.util.get_node_ip_address()
        hosts = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
        if hosts <= {here}:
            return "tcp://127.0.0.1:*"
        if not curve_keys:
            raise ConfigError(f"--set launcher=ray: the cluster spans {len(hosts)} hosts, so the "
                              "controller listens on TCP and needs CurveZMQ keys: --set "
                              "curve_keys=DIR (python -m pivotflow.transport.curve keygen DIR; "
                              "the same folder on every node)")
        return f"tcp://[{here}]:*" if ":" in here else f"tcp://{here}:*"

    def close(self) -> None:
        import ray

        if self.owned and ray.is_initialized():
            ray.shutdown()


@dataclass
class Slot:
    """One bundle of the placement group and the host actor in it (one per worker run)."""

    bundle: int
    actor: Any = None
    where: Any = None  # the actor's where(): a dict, or the ObjectRef until it is asked
    worker: str | None = None


@dataclass
class HostedWorker:
    """A worker started on the cluster. ``pid`` is on its node (the same host on a fake
    cluster); ``code`` is set once its exit is known. It keeps its own host actor and
    placement: its slot may hold another worker's by the time its death is read."""

    worker_id: str
    slot: Slot
    actor: Any
    where: Any
    pid_ref: Any
    wait_ref: Any
    code: int | None = None
    started_at: float = field(default_factory=time.monotonic)
    placed: bool = False  # its host started it (before: the bundle may wait for a node)
    lost: str = ""  # why its host went (the stderr tail can no longer be read)
    killed: bool = False
    host_retries: int = 0  # host actors that died before starting it (their node going)
    _pid: int | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        if self._pid is None:
            import ray

            try:
                self._pid = int(ray.get(self.pid_ref, timeout=CALL_TIMEOUT_S))
            except Exception:  # noqa: BLE001 - its host never started it: no pid to name
                self._pid = -1
        return self._pid


class RayLauncher:
    """Starts workers in the bundles of one placement group; same interface as LocalLauncher.
    Raises ConfigError when the cluster cannot place ``slots`` bundles in ``place_timeout_s``."""

    def __init__(self, endpoint: str, log_dir: Path, threads: int = 1, curve_keys: str = "",
                 *, slots: int, cpus: float = 1.0, gpus: float = 0.0, strategy: str = "PACK",
                 place_timeout_s: float = 60.0, run_tag: str = "run",
                 cluster: RayCluster | None = None, secret_file: str = "") -> None:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        from pivotflow.launch.ray_host import WorkerHost

        self.endpoint, self.curve_keys, self.threads = endpoint, curve_keys, threads
        self.secret_file = secret_file  # removed by ``stop``; see launch/workers.py
        self.cluster = cluster  # closed by ``stop`` (its connection, if it made it)
        self.place_timeout_s = place_timeout_s
        self.log_dir, self.run_tag = log_dir, run_tag
        log_dir.mkdir(parents=True, exist_ok=True)
        self.bundle = {k: v for k, v in (("CPU", cpus), ("GPU", gpus)) if v > 0}
        if not self.bundle:
            raise ConfigError("--set ray.cpus_per_worker=0 with no GPUs: a worker's bundle "
                              "must reserve something")
        # threaded: wait() blocks while kill, tail and free_port answer
        self.host_cls = ray.remote(max_concurrency=4)(WorkerHost)  # type: ignore[call-overload]
        self.procs: dict[str, HostedWorker] = {}
        self.nodes_used: set[str] = set()
        self.nodes_lost: set[str] = set()
        # nodes whose actors died while Ray still called them alive: a killed host is declared
        # dead only after its health checks fail (tests/multihost; remove_node is at once)
        self.suspects: set[str] = set()
        self.suspects_checked = 0.0
        self.host_retries = 0
        self.rendezvous_made = 0
        self.stopped = False
        self.head_root = ""  # the run's store (the controller's node), once share_store named it
        self.stores: Any = None  # ray_stores.NodeStores, from the first start
        self.worker_roots: dict[str, str] = {}
        t0 = time.perf_counter()
        self.pg = placement_group([dict(self.bundle)] * slots, strategy=strategy,
                                  name=f"pivotflow-{run_tag}")
        ready, _ = ray.wait([self.pg.ready()], timeout=place_timeout_s)
        if not ready:
            remove_placement_group(self.pg)
            have = {k: v for k, v in ray.available_resources().items() if k in ("CPU", "GPU")}
            raise ConfigError(f"--set launcher=ray: the cluster did not place {slots} workers "
                              f"of {self.bundle} ({strategy}) in {place_timeout_s:g} s (free "
                              f"now: {have}); lower ray.cpus_per_worker or add nodes")
        self.place_s = 0.0
        self.slots = [Slot(i, actor=self._new_actor(i)) for i in range(slots)]
        try:
            wheres = ray.get([s.actor.where.remote() for s in self.slots],
                             timeout=place_timeout_s)
        except Exception:
            self.stop()
            raise
        for s, w in zip(self.slots, wheres, strict=True):
            s.where = w
        self.slots.sort(key=lambda s: _placement_key(s.where, s.bundle))
        self.place_s = time.perf_counter() - t0

    def _new_actor(self, bundle: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return self.host_cls.options(
            num_cpus=self.bundle.get("CPU", 0), num_gpus=self.bundle.get("GPU", 0),
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.pg, placement_group_bundle_index=bundle),
        ).remote(self.run_tag)

    def share_store(self, root: str) -> None:
        """Give each node holding workers a copy of the run's store at ``root`` (from the first
        ``start``: a failure then is inside the run's try, so ``stop`` still cleans up)."""
        self.head_root = root

    def store_dir_for(self, worker_id: str) -> str:
        """The store root on ``worker_id``'s node (its Welcome names it)."""
        if self.stores is None:
            return self.head_root
        h = self.procs[worker_id]
        node = self._node_of(h) or self._node_of_slow(h)
        root = self.stores.root_for(node) if node else self.head_root
        self.worker_roots[worker_id] = root
        return root

    def _node_of_slow(self, h: HostedWorker) -> str:
        import ray

        try:
            h.where = ray.get(h.where, timeout=CALL_TIMEOUT_S) if not isinstance(
                h.where, dict) else h.where
        except Exception:  # noqa: BLE001 - its actor went: the worker will be reported dead
            return ""
        return self._node_of(h)

    def start(self, worker_id: str) -> None:
        if self.head_root and self.stores is None:
            from pivotflow.launch.ray_stores import NodeStores

            self.stores = NodeStores(self.run_tag, self.head_root)
            self.stores.ensure({self._node_of(s) for s in self.slots} - {""})
        slot = self._free_slot()
        if slot.actor is None:  # its last actor is gone: a new one (Ray re-places the bundle)
            slot.actor = self._new_actor(slot.bundle)
            slot.where = slot.actor.where.remote()
        slot.worker = worker_id
        self.procs[worker_id] = HostedWorker(
            worker_id, slot, slot.actor, slot.where,
            pid_ref=self._start_on(slot.actor, worker_id), wait_ref=slot.actor.wait.remote())

    def _start_on(self, actor: Any, worker_id: str) -> Any:  # the worker's start call
        argv = ["--endpoint", self.endpoint, "--id", worker_id,
                *(["--curve-keys", self.curve_keys] if self.curve_keys else [])]
        return actor.start.remote(worker_id, argv, self.threads, self.secret_file)

    def _host_again(self, h: HostedWorker) -> None:
        """``h``'s host actor died before starting the worker: its bundle is most likely on a
        node that is going but not yet declared dead. A new host actor in that bundle (placed
        once Ray re-places it); ``place_timeout_s`` still bounds the wait."""
        h.host_retries += 1
        self.host_retries += 1
        node = self._node_of(h)
        if node:
            self.suspects.add(node)
        actor = self._new_actor(h.slot.bundle)
        h.slot.actor, h.slot.where = actor, actor.where.remote()
        h.actor, h.where = actor, h.slot.where
        h.pid_ref, h.wait_ref = self._start_on(actor, h.worker_id), actor.wait.remote()

    def _free_slot(self) -> Slot:
        """The first bundle, in placement order, with no worker, else one whose worker ended
        (its log is copied to the run folder and its host actor let go first)."""
        for s in self.slots:
            if s.worker is None:
                return s
        self.exited()
        for s in self.slots:
            h = self.procs[s.worker] if s.worker else None
            if h is not None and (h.code is not None or h.killed):
                self._retire(s)
                return s
        raise RuntimeError(f"every one of the {len(self.slots)} bundles holds a running worker")

    def _retire(self, slot: Slot) -> None:
        import ray

        h = self.procs[slot.worker] if slot.worker else None
        if h is not None:
            if h.actor is not None:
                self._save_log(h)
                ray.kill(h.actor)  # its worker dies with it (PDEATHSIG) if it still ran
            if h.code is None:  # killed, its exit not read yet: it is read as this now
                h.code = NODE_LOST_CODE
            h.actor = None
        slot.actor, slot.worker = None, None

    def _save_log(self, h: HostedWorker) -> None:
        import ray

        try:
            data = ray.get(h.actor.take_log.remote(MAX_LOG_BYTES), timeout=CALL_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - its node went as we asked
            data = f"(log not read from its node: {type(exc).__name__})\n".encode()
        (self.log_dir / f"{h.worker_id}.log").write_bytes(data)

    def kill(self, worker_id: str) -> bool:
        """SIGKILL a worker (on its node); True if it was alive. Its actor stays, for its log,
        until the bundle is needed again or ``stop``."""
        import ray

        h = self.procs.get(worker_id)
        if h is None or h.code is not None or h.actor is None:
            return False
        h.killed = True
        try:
            return bool(ray.get(h.actor.kill.remote(), timeout=CALL_TIMEOUT_S))
        except Exception:  # noqa: BLE001 - the actor (its node) is gone: so is the worker
            return False

    def stderr_tail(self, worker_id: str, chars: int = 2000) -> str:
        import ray

        h = self.procs.get(worker_id)
        if h is None:
            return ""
        if h.lost or h.actor is None:
            saved = self.log_dir / f"{worker_id}.log"
            text = saved.read_text(errors="replace")[-chars:] if saved.is_file() else ""
            return (h.lost + "\n" + text).strip()[-chars:]
        try:
            return str(ray.get(h.actor.tail.remote(chars), timeout=CALL_TIMEOUT_S))
        except Exception as exc:  # noqa: BLE001
            return f"(stderr not read from its node: {type(exc).__name__})"

    def exited(self) -> list[tuple[str, int]]:
        """Workers whose process ended since they started: (worker_id, return code); a worker
        whose node (or host actor) went counts as killed, ``NODE_LOST_CODE``."""
        import ray

        pending = {h.wait_ref: h for h in self.procs.values() if h.code is None}
        if pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
            for ref in ready:
                self._ended(pending[ref], ref)
        self._check_placed()
        self._check_suspects()
        if self.stores is not None and self.nodes_lost & set(self.stores.agents):
            self.stores.drop(self.nodes_lost)  # the agents left re-form their group
        return [(w, h.code) for w, h in self.procs.items() if h.code is not None]

    def _check_placed(self) -> None:
        """A replacement whose bundle no node takes (the cluster shrank below the run) ends
        after ``place_timeout_s``, named as such, instead of waiting for ever."""
        import ray

        waiting = {h.pid_ref: h for h in self.procs.values() if h.code is None and not h.placed}
        if not waiting:
            return
        ready, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=0)
        for ref in ready:
            waiting.pop(ref).placed = True
        now = time.monotonic()
        for h in waiting.values():
            if now - h.started_at > self.place_timeout_s and h.actor is not None:
                h.code = NODE_LOST_CODE
                h.lost = (f"no Ray node took its bundle {self.bundle} in "
                          f"{self.place_timeout_s:g} s (ray.place_timeout_s): the cluster has "
                          "too few resources left for the run's workers")
                ray.kill(h.actor)
                self._forget_actor(h)

    def _check_suspects(self) -> None:
        """A suspect node Ray has since declared dead is a lost node (its store agent is
        dropped, the agents left re-form their group)."""
        now = time.monotonic()
        if not self.suspects or now - self.suspects_checked < SUSPECT_CHECK_S:
            return
        self.suspects_checked = now
        for node in list(self.suspects):
            if not _node_alive(node):
                self.suspects.discard(node)
                self.nodes_lost.add(node)

    def _ended(self, h: HostedWorker, ref: Any) -> None:
        import ray

        try:
            h.code = int(ray.get(ref))
        except ray.exceptions.RayError as exc:
            if (h.actor is not None and h.slot.worker == h.worker_id and not _started(h)
                    and time.monotonic() - h.started_at < self.place_timeout_s):
                self._host_again(h)
                return
            h.code = NODE_LOST_CODE
            node = self._node_of(h)
            if node and not _node_alive(node):
                self.nodes_lost.add(node)
                h.lost = f"its Ray node {node[:12]} left the cluster (the worker went with it)"
            else:
                if node:
                    self.suspects.add(node)
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                h.lost = f"its Ray host actor died ({type(exc).__name__}: {first})"
            self._forget_actor(h)

    @staticmethod
    def _forget_actor(h: HostedWorker) -> None:
        """``h``'s host actor is dead: its bundle takes a new one (if still ``h``'s)."""
        h.actor = None
        if h.slot.worker == h.worker_id:
            h.slot.actor = None

    def _node_of(self, held: Slot | HostedWorker) -> str:
        """The node of a slot's actor, or of a worker's (its where(), asked once)."""
        import ray

        if not isinstance(held.where, dict):
            try:
                held.where = ray.get(held.where, timeout=0.5)
            except Exception:  # noqa: BLE001 - the actor died before it answered
                return ""
        node = str(held.where.get("node_id", ""))
        self.nodes_used.add(node)
        return node

    def rendezvous(self, worker_id: str, epoch: int) -> str:
        """The trainers' group address for ``epoch``: a port free now on rank 0's node
        (``worker_id``), where rank 0 then serves the TCPStore the others join."""
        import ray

        h = self.procs[worker_id]
        ip, port = ray.get(h.actor.free_port.remote(), timeout=CALL_TIMEOUT_S)
        self.rendezvous_made += 1
        return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"

    def stats(self) -> dict[str, Any]:
        """For the run's summary (``ray``): where workers ran, what went, placement time."""
        for s in self.slots:
            if s.actor is not None:
                self._node_of(s)
        return {"bundles": len(self.slots), "bundle": self.bundle,
                "nodes_used": len(self.nodes_used), "node_failures": len(self.nodes_lost),
                "place_s": round(self.place_s, 3), "rendezvous": self.rendezvous_made,
                "host_retries": self.host_retries,
                **({"stores": {**self.stores.stats(), "workers": dict(self.worker_roots)}}
                   if self.stores is not None else {})}

    def stop(self, timeout_s: float = 5.0) -> None:
        """Wait for workers to exit, then terminate, then kill; copy every log to the run
        folder; kill the host actors and remove the placement group."""
        import ray
        from ray.util.placement_group import remove_placement_group

        if self.stopped:
            return
        self.stopped = True
        self.stats()  # the nodes, while the actors still answer
        for h in self.procs.values():
            _ = h.pid  # now: once the connection is closed, a ray.get would open a new one
        running = [h for h in self.procs.values() if h.code is None and h.actor is not None]
        if running:
            ray.wait([h.wait_ref for h in running], num_returns=len(running), timeout=timeout_s)
            ends = [h.actor.terminate.remote(2.0) for h in running]
            ray.wait(ends, num_returns=len(ends), timeout=CALL_TIMEOUT_S)
        self.suspects_checked = 0.0  # now, not throttled: the summary counts lost nodes
        self.exited()
        for s in self.slots:
            if s.worker is not None and s.actor is not None:
                self._save_log(self.procs[s.worker])
            if s.actor is not None:
                ray.kill(s.actor)
                s.actor = None
        for h in self.procs.values():
            if h.lost and not (self.log_dir / f"{h.worker_id}.log").exists():
                (self.log_dir / f"{h.worker_id}.log").write_text(h.lost + "\n")
        if self.stores is not None:  # after the workers: the last version reaches the head
            self.stores.stop()
        remove_placement_group(self.pg)
        if self.secret_file:
            Path(self.secret_file).unlink(missing_ok=True)
        if self.cluster is not None:
            self.cluster.close()


def _placement_key(where: dict[str, Any], bundle: int) -> tuple[Any, ...]:
    ip = ipaddress.ip_address(where["ip"])
    gpus = [int(g) for g in where["gpus"] if str(g).isdigit()]
    return (ip.version, int(ip), gpus, where["node_id"], bundle)


def _started(h: HostedWorker) -> bool:
    """Whether ``h``'s host actor started its worker (its pid came back)."""
    import ray

    try:
        ray.get(h.pid_ref, timeout=0)
    except Exception:  # noqa: BLE001 - it died first, or has not answered
        return False
    return True


def _node_alive(node_id: str) -> bool:
    import ray

    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())
