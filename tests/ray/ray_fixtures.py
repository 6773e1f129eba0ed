"""The fake Ray cluster the tests here run on, and what a run may leave on it (nothing)."""

from __future__ import annotations

import os
from typing import Any

# Ray binds the host's external address unless this is off; no usage reports; loopback only.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

NODE_CPUS = 2  # logical: a node takes two workers of one CPU each (the host has 2 cores)


class FakeCluster:
    def __init__(self, nodes: int) -> None:
        import ray
        from ray.cluster_utils import Cluster

        self.cluster = Cluster(initialize_head=True,
                               head_node_args={"num_cpus": 0, "include_dashboard": False})
        self.nodes = [self.cluster.add_node(num_cpus=NODE_CPUS) for _ in range(nodes)]
        self.cluster.wait_for_nodes()
        self.address = self.cluster.address
        ray.init(address=self.address, log_to_driver=False)  # the runs reuse this connection

    def remove_node(self, node_id: str) -> None:
        [node] = [n for n in self.nodes if n.node_id == node_id]
        self.nodes.remove(node)
        self.cluster.remove_node(node)

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
