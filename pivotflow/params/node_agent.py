"""One store agent per node: it keeps that node's parameter store level with the others'.

The Ray launcher starts a ``StoreAgent`` actor pinned to every node that holds workers, and one
on the controller's node whose root is the run's own store (the controller reads it for
checkpoints). The agents form a gloo group (rank 0: the controller's node) and work in rounds,
the same in every agent, so no one has to tell them what was published where:

1. every agent gathers every other's inventory: the versions of each model in its store
   (a trainer publishing on its node, or the run's initial publish on the controller's);
2. for each of a model's newest ``keep_for(model)`` versions (over all nodes) that some node
   lacks, the lowest rank holding it broadcasts it (``node_sync.VersionSync``): the nodes that
   lack it publish it into their own store when whole, the others let it pass; each store is
   then collected down to ``keep_for(model)`` versions by its own reference counts (a version
   a reader holds stays). Not only the newest: a trainer lost mid-step is redone from the
   version *before* the one it may have published, and its replacement, perhaps on a node
   that joined since, must find that version (and its AdamW state) on its own node;
3. note in ``<root>/.crossed/<model>`` the newest version every node has (a trainer waits for
   its version there before it reports the step: a node lost just after could otherwise take
   the only copy of a version the controller already counts on);
4. wait ``poll_s`` and start again. An agent told to stop leaves after a round in which nothing
   was lacking (so the last version reaches the controller's store before the run reads it).

A round that fails (a node gone mid-collective) leaves the agent out of any group until the
launcher re-forms one among the agents that remain (``join`` with a new epoch): the versions a
lost node had are still on whichever node published them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from pivotflow.params.optim_entries import is_optim

log = logging.getLogger(__name__)

KEEP = 3  # versions each node keeps of a model (the trainer keeps 3 of the policy)
KEEP_OPTIM = 2  # and of its AdamW state (``<model>.optim``), as the trainer keeps


def keep_for(model: str) -> int:
    """How many of ``model``'s newest versions every node holds (what its trainer keeps, so
    that a version the trainer collected is not sent back to it)."""
    return KEEP_OPTIM if is_optim(model) else KEEP
CROSSED = ".crossed"  # in a store root: per model, the newest version every node has
CROSSED_WAIT_S = 60.0
GROUP_TIMEOUT_S = 30.0  # a collective with a silent peer fails after this
OWNER_FILE = "OWNER_PID"  # as run.py marks its store: a dead owner's root is swept


class StoreAgent:
    """This node's store agent (a threaded Ray actor; its rounds run in their own thread)."""

    def __init__(self, root: str, owned: bool, poll_s: float = 0.05) -> None:
        from pivotflow.params.shm_store import ShmParamStore

        self.root, self.owned, self.poll_s = Path(root), owned, poll_s
        if owned:
            sweep_dead_stores(self.root.parent)  # earlier runs' roots on this node, SIGKILLed
        self.store = ShmParamStore(self.root)
        if owned:  # its owner is this agent: if it is SIGKILLed, a later sweep removes it
            (self.root / OWNER_FILE).write_text(str(os.getpid()))
        self.lock = threading.Lock()
        self.pending: tuple[int, int, int, str] | None = None
        self.joined = threading.Condition(self.lock)
        self.epoch, self.rank, self.world = -1, 0, 1
        self.formed: dict[int, str] = {}  # epoch -> "" (formed) or why not
        self.stopping = False
        self.stopped = threading.Event()
        self.rounds = 0
        self.clean_round = -1  # the last round (this epoch) in which no node lacked a version
        self.sent: dict[str, list[int]] = {}
        self.received: dict[str, list[int]] = {}
        self.cross_s: list[float] = []  # publish on its node -> visible here, per version
        self.formed_at = 0.0  # versions published before are catch-ups, not timed
        self.bytes_in = 0
        self.failures: list[str] = []
        self.noted: dict[str, int] = {}  # what .crossed says, per model
        threading.Thread(target=self._loop, name="store-agent", daemon=True).start()

    def where(self) -> dict[str, Any]:
        import ray

        return {"ip": ray.util.get_node_ip_address(),
                "node_id": ray.get_runtime_context().get_node_id(), "root": str(self.root)}

    def free_port(self) -> tuple[str, int]:
        """A TCP port free on this node now (the group's rendezvous when this is rank 0)."""
        ip = self.where()["ip"]
        with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as s:
            s.bind((ip, 0))
            return ip, int(s.getsockname()[1])

    def join(self, epoch: int, rank: int, world: int, rendezvous: str) -> str:
        """Be rank ``rank`` of ``world`` from ``epoch`` on; returns once the group is formed
        (every member is called at once), "" or the reason it could not be."""
        with self.lock:
            self.pending = (epoch, rank, world, rendezvous)
            self.joined.wait_for(lambda: epoch in self.formed, timeout=GROUP_TIMEOUT_S * 2)
            return self.formed.get(epoch, "timed out")

    def synced_since(self, rounds: int) -> bool:
        """Whether a round after ``rounds`` of this epoch found no node lacking a version."""
        return self.clean_round > rounds

    def progress(self) -> int:
        return self.rounds

    def stop(self, timeout_s: float) -> bool:
        """Leave after the next round in which nothing is lacking; True if it left so."""
        self.stopping = True
        return self.stopped.wait(timeout_s)

    def stats(self) -> dict[str, Any]:
        return {"root": str(self.root), "rank": self.rank, "epoch": self.epoch,
                "rounds": self.rounds, "sent": self.sent, "received": self.received,
                "bytes_in": self.bytes_in, "cross_s": [round(x, 4) for x in self.cross_s],
                "failures": self.failures}

    def cleanup(self) -> None:
        """Remove this node's copy (unless it is the controller's store, which run.py removes)
        and any root on this node whose owner is dead (a lost node's, on a shared host)."""
        if self.owned:
            self.store.cleanup()
        sweep_dead_stores(self.root.parent)

    # --- the rounds, in the agent's own thread -------------------------------------------

    def _loop(self) -> None:
        import torch.distributed as dist

        while True:
            with self.lock:
                pending, self.pending = self.pending, None
            if pending is not None:
                self._form(*pending)
            if self.world > 1 and dist.is_initialized():
                try:
                    if self._round():
                        break
                except Exception as exc:  # noqa: BLE001 - a peer went: wait for a new group
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                    self.failures.append(f"epoch {self.epoch}: {type(exc).__name__}: {first}")
                    log.warning("store agent %s: round failed (%s); waiting for a new group",
                                self.root, self.failures[-1])
                    self._leave()
            elif self.stopping:
                break
            time.sleep(self.poll_s)
        self._leave()
        self.stopped.set()

    def _form(self, epoch: int, rank: int, world: int, rendezvous: str) -> None:
        import torch.distributed as dist

        from pivotflow.worker.train_group import _interface_towards

        self._leave()
        try:
            if world > 1:
                host, _, port = rendezvous[len("tcp://"):].rpartition(":")
                host = host.strip("[]")
                ifname = _interface_towards(host)
                if ifname:
                    os.environ.setdefault("GLOO_SOCKET_IFNAME", ifname)
                store = dist.TCPStore(host, int(port), world, is_master=rank == 0,
                                      timeout=timedelta(seconds=GROUP_TIMEOUT_S),
                                      wait_for_workers=False)
                dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                        timeout=timedelta(seconds=GROUP_TIMEOUT_S))
            err = ""
        except Exception as exc:  # noqa: BLE001 - a member never came
            err = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
            world = 1
        if world == 1:  # alone: no copy to wait for (a trainer here no longer waits)
            shutil.rmtree(self.root / CROSSED, ignore_errors=True)
            self.noted.clear()
        with self.lock:
            self.formed[epoch] = err
            if not err:
                self.epoch, self.rank, self.world = epoch, rank, world
                self.formed_at = time.time()
            self.clean_round = -1
            self.joined.notify_all()

    def _leave(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        self.world = 1

    def _round(self) -> bool:
        """One round (see the module's docstring); True when the agents are to stop."""
        import torch.distributed as dist

        from pivotflow.params.node_sync import VersionSync

        mine = self._inventory()
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, {"have": mine, "stop": self.stopping})
        lacking = False
        for model in sorted({m for g in gathered for m in g["have"]}):
            held = [set(g["have"].get(model, (-1, 0.0, []))[2]) for g in gathered]
            for version in sorted(set().union(*held))[-keep_for(model):]:
                if all(version in h for h in held):
                    continue
                lacking = True
                src = min(r for r, h in enumerate(held) if version in h)
                sync = VersionSync(self.store, src=src)
                if src == self.rank:
                    if sync.send(model, version) is not None:
                        self.sent.setdefault(model, []).append(version)
                    continue
                wanted = version not in held[self.rank]
                got = sync.receive(publish=wanted)
                if got is not None and wanted:
                    self.received.setdefault(model, []).append(version)
                    newest, published, _ = gathered[src]["have"][model]
                    if version == newest and published >= self.formed_at:  # not a catch-up
                        self.cross_s.append(time.time() - published)
                    self.bytes_in += sync.last_bytes
                    self.store.gc(model, keep=keep_for(model))
        self._note_crossed(gathered)
        self.rounds += 1
        if not lacking:
            self.clean_round = self.rounds
        return not lacking and any(g["stop"] for g in gathered)

    def _note_crossed(self, gathered: list[Any]) -> None:
        crossed = self.root / CROSSED
        crossed.mkdir(exist_ok=True)
        for model in {m for g in gathered for m in g["have"]}:
            everywhere = min(g["have"].get(model, (-1, 0.0))[0] for g in gathered)
            if everywhere >= 0 and self.noted.get(model) != everywhere:
                tmp = crossed / f".{model}.tmp"
                tmp.write_text(str(everywhere))
                os.replace(tmp, crossed / model)
                self.noted[model] = everywhere

    def _inventory(self) -> dict[str, tuple[int, float, list[int]]]:
        """{model: (newest version here, when it was published: its LATEST pointer's mtime,
        every version held here)}."""
        have = {}
        for mdir in self.root.iterdir():
            if mdir.name.startswith(".") or not mdir.is_dir():
                continue
            try:
                have[mdir.name] = (int((mdir / "LATEST").read_text()),
                                   (mdir / "LATEST").stat().st_mtime,
                                   self.store.versions(mdir.name))
            except (OSError, ValueError):
                continue  # nothing published yet, or a pointer being replaced: next round
        return have


def wait_crossed(root: Path, model: str, version: int, timeout_s: float = CROSSED_WAIT_S) -> bool:
    """For a publisher: until every node's store has ``model@version`` (or newer). No wait when
    ``root`` is no node agent's store of a group (the local launcher's, or a node alone).
    False after ``timeout_s`` (the caller goes on: its node keeps the version)."""
    pointer = root / CROSSED / model
    deadline = time.monotonic() + timeout_s
    while (root / CROSSED).is_dir():
        with contextlib.suppress(OSError, ValueError):
            if int(pointer.read_text()) >= version:
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def sweep_dead_stores(base: Path) -> list[Path]:
    """run.py's sweep (stores whose owner process is gone), on this node."""
    from pivotflow.run import sweep_dead_stores as sweep

    return sweep(base)
