"""A fake Ray cluster on this host (``ray.cluster_utils.Cluster``): a head that runs nothing and
two worker nodes, each its own raylet, all on loopback. One per test module: it takes ~15 s to
start on a small machine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ray_fixtures import FakeCluster


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[FakeCluster]:
    pytest.importorskip("ray")
    cluster = FakeCluster(nodes=2)
    try:
        yield cluster
    finally:
        cluster.shutdown()
