"""The run's store agents on a Ray cluster: one per node (``params/node_agent.py``), kept by the
Ray launcher as the nodes holding its workers come and go.

The controller's node keeps the run's own store (run.py made it and published the initial
versions there); every other node gets its own root, ``/dev/shm/pivotflow-<run>-<node[:8]>``,
so a worker on node B reads B's copy (its ``Welcome`` names it: ``root_for``). Whenever the set
of nodes changes (the first start, a node lost, a node that joined takes a bundle) the agents'
group is re-formed with a new epoch, and the launcher waits for one round in which no node
lacks a version before a worker there starts loading.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

from pivotflow.errors import WorkerError

SYNC_TIMEOUT_S = 120.0  # for a new group's first complete round (it may carry whole models)
CALL_TIMEOUT_S = 10.0
POLL_S = 0.05  # between the agents' rounds: a version waits at most this before it crosses


class NodeStores:
    """The store agents of one run, keyed by Ray node id."""

    def __init__(self, run_tag: str, head_root: str, poll_s: float = POLL_S) -> None:
        import ray

        from pivotflow.params.node_agent import StoreAgent

        self.run_tag, self.head_root, self.poll_s = run_tag, head_root, poll_s
        self.cls = ray.remote(max_concurrency=4)(StoreAgent)  # type: ignore[call-overload]
        self.head = ray.get_runtime_context().get_node_id()  # the controller's node
        self.agents: dict[str, Any] = {}
        self.roots: dict[str, str] = {}
        self.epoch = 0
        self.reforms = 0
        self.sync_s: list[float] = []  # a new group's first complete round, each time
        self.final: dict[str, Any] = {}
        self.gone: dict[str, dict[str, Any]] = {}  # the stats of agents whose node went

    def root_for(self, node: str) -> str:
        """``node``'s store root; a node without an agent gets one first, caught up."""
        if node not in self.agents:
            self.ensure({node})
        return self.roots[node]

    def ensure(self, nodes: set[str]) -> None:
        """An agent on each of ``nodes`` (and the controller's); re-forms the group when one
        is added, and returns once every node has every model's newest version."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from pivotflow.params.shm_store import default_root

        new = (nodes | {self.head}) - set(self.agents)
        for node in sorted(new):
            root = (self.head_root if node == self.head
                    else str(default_root(f"{self.run_tag}-{node[:8]}")))
            self.agents[node] = self.cls.options(
                num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote(root, node != self.head, self.poll_s)
            self.roots[node] = root
        if new:
            self._reform()

    def drop(self, nodes: set[str]) -> None:
        """Forget the agents of ``nodes`` (gone with their node) and re-form the group."""
        import ray

        lost = set(self.agents) & nodes - {self.head}
        for node in lost:
            self.gone[node] = {"root": self.roots[node], "lost": True}
            ray.kill(self.agents.pop(node))
        if lost:
            self._reform()

    def _reform(self) -> None:
        import ray

        order = [self.head, *sorted(set(self.agents) - {self.head})]
        self.epoch += 1
        if len(order) == 1:  # the controller's node alone: its agent leaves any group
            ray.get(self.agents[self.head].join.remote(self.epoch, 0, 1, ""),
                    timeout=SYNC_TIMEOUT_S)
            return
        self.reforms += 1
        t0 = time.perf_counter()
        agents = [self.agents[n] for n in order]
        try:  # a new agent's first answer waits for its process (torch imported): minutes at most
            before = ray.get([a.progress.remote() for a in agents], timeout=SYNC_TIMEOUT_S)
            ip, port = ray.get(self.agents[self.head].free_port.remote(),
                               timeout=CALL_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - an agent that never started: say which run
            raise WorkerError(f"the store agents on {len(order)} nodes did not start in "
                              f"{SYNC_TIMEOUT_S:g} s ({type(exc).__name__})") from None
        where = f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"
        errors = ray.get([a.join.remote(self.epoch, rank, len(order), where)
                          for rank, a in enumerate(agents)], timeout=SYNC_TIMEOUT_S)
        bad = [(n[:12], e) for n, e in zip(order, errors, strict=True) if e]
        if bad:
            raise WorkerError(f"the store agents' group (epoch {self.epoch}, {len(order)} "
                              f"nodes) did not form at {where}: {bad[0][0]}: {bad[0][1]}")
        deadline = time.monotonic() + SYNC_TIMEOUT_S
        while not all(ray.get([a.synced_since.remote(r) for a, r in zip(agents, before,
                                                                         strict=True)],
                              timeout=CALL_TIMEOUT_S)):
            if time.monotonic() > deadline:
                raise WorkerError(f"the store agents on {len(order)} nodes did not bring every "
                                  f"node's store level in {SYNC_TIMEOUT_S:g} s")
            time.sleep(0.02)
        self.sync_s.append(time.perf_counter() - t0)

    def stats(self) -> dict[str, Any]:
        """For the run's summary (under ``ray.stores``): what crossed, how fast."""
        if self.final:
            return self.final
        import ray

        by_node: dict[str, Any] = dict(self.gone)
        for node, agent in self.agents.items():
            try:
                by_node[node] = ray.get(agent.stats.remote(), timeout=CALL_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - its node went as we asked
                by_node[node] = {"root": self.roots[node], "error": type(exc).__name__}
        cross = [x for s in by_node.values() for x in s.get("cross_s", [])]
        return {
            "nodes": len(self.roots), "roots": len(set(self.roots.values())),
            "reforms": self.reforms,
            "versions_crossed": sum(len(v) for s in by_node.values()
                                    for v in s.get("received", {}).values()),
            "bytes_crossed": sum(s.get("bytes_in", 0) for s in by_node.values()),
            "cross_s_median": round(statistics.median(cross), 4) if cross else None,
            "cross_s_max": round(max(cross), 4) if cross else None,
            "group_sync_s": [round(x, 3) for x in self.sync_s],
            "by_node": {n[:12]: s for n, s in by_node.items()},
        }

    def stop(self, timeout_s: float = 30.0) -> None:
        """Let the agents finish (the last versions reach the controller's store), keep their
        figures, remove every node's copy, and kill them."""
        import ray

        agents = list(self.agents.values())
        # a node that went while stopping took its agent: the others still stop
        with contextlib.suppress(Exception):
            ray.get([a.stop.remote(timeout_s) for a in agents], timeout=timeout_s + 5)
        self.final = self.stats()
        cleanups = [a.cleanup.remote() for a in agents]
        ray.wait(cleanups, num_returns=len(cleanups), timeout=CALL_TIMEOUT_S)
        for a in agents:
            ray.kill(a)
        self.agents.clear()
