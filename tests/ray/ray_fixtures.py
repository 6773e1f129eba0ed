"""The fake Ray cluster the tests here run on, and what a run may leave on it (nothing)."""

from __future__ import annotations

import os
from typing import Any

# Ray binds the host's external address unless this is off; no usage reports; loopback only.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

NODE_CPUS = 2  # logical: a node takes two workers of one CPU each (the host has 2 cores)


class FakeCluster:
    """A head that runs nothing and ``nodes`` worker nodes of NODE_CPUS each; this process is
    connected to it (runs reuse the connection)."""

    def __init__(self, nodes: int) -> None:
        import ray
        from ray.cluster_utils import Cluster

        self.cluster = Cluster(initialize_head=True,
                               head_node_args={"num_cpus": 0, "include_dashboard": False})
        self.nodes = [self.cluster.add_node(num_cpus=NODE_CPUS) for _ in range(nodes)]
        self.cluster.wait_for_nodes()
        self.address = self.cluster.address
        ray.init(address=self.address, log_to_driver=False)  # the runs reuse this connection

    def add_node(self) -> str:
        node = self.cluster.add_node(num_cpus=NODE_CPUS)
        self.nodes.append(node)
        self.cluster.wait_for_nodes()
        return str(node.node_id)

    def remove_node(self, node_id: str) -> None:
        [node] = [n for n in self.nodes if n.node_id == node_id]
        self.nodes.remove(node)
        self.cluster.remove_node(node)

    def node_of_pid(self, pid: int) -> str | None:
        """The node whose raylet ``pid`` descends from (a worker's, through its host actor)."""
        raylets = {p.process.pid: n.node_id for n in self.nodes
                   for p in n.all_processes.get("raylet", [])}
        while pid > 1 and pid not in raylets:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    pid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                return None
        return raylets.get(pid)

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()


def left_on_cluster() -> dict[str, Any]:
    """Placement groups not removed and actors alive (none after a run stops)."""
    import ray
    from ray._private.state import actors

    groups = [g["name"] for g in ray.util.placement_group_table().values()
              if g["state"] != "REMOVED"]
    alive = [a["ActorID"] for a in actors().values() if a["State"] != "DEAD"]
    return {"placement_groups": groups, "actors": alive}


def descendants() -> list[int]:
    """This process's descendants (the cluster's raylets, GCS, actors, workers), from /proc."""
    me = os.getpid()
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue

    def descends(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == me:
                return True
        return False

    return [pid for pid in parent if descends(pid)]


def worker_pid(worker_id: str) -> int | None:
    """The pid of this test's worker process ``worker_id`` (never another session's)."""
    for pid in descendants():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"pivotflow.worker" in argv and worker_id.encode() in argv:
            return pid
    return None


def listening_addresses() -> set[str]:
    """The addresses this process's descendants listen on, read from /proc: TCP sockets in
    LISTEN state, IPv4 and IPv6."""
    inodes: set[str] = set()
    for pid in descendants():
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    found.add(_hex_address(cols[1].split(":")[0], width))
    return found


def _hex_address(hexed: str, width: int) -> str:
    import ipaddress

    raw = bytes.fromhex(hexed)
    if width == 8:
        return str(ipaddress.IPv4Address(raw[::-1]))
    # /proc/net/tcp6 keeps each 32-bit word in host (little-endian) order
    v6 = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return str(v6.ipv4_mapped or v6)  # ::ffff:127.0.0.1 is 127.0.0.1
