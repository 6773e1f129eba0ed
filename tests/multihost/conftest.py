"""Two namespace hosts with a Ray cluster across them (head on A, a worker node on B), once per
module: they start in ~10-40 s on a small machine. Skipped, with the reason, where network
namespaces cannot be made (not root, no ``ip``); in CI, as root, it runs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from netns_hosts import Cluster, TwoHosts, can_make_hosts, leftovers, start_ray  # noqa: E402

HEAD_CPUS = 4  # logical: A holds every bundle of a run once B is gone


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    pytest.importorskip("ray")
    why = can_make_hosts()
    if why:
        pytest.skip(f"two namespace hosts cannot be made here: {why}")
    keys = tmp_path_factory.mktemp("keys") / "curve"
    subprocess.run([sys.executable, "-m", "pivotflow.transport.curve", "keygen", str(keys)],
                   check=True, capture_output=True)
    hosts = TwoHosts()
    try:
        hosts.b.copy_in(keys)
        address = start_ray(hosts, cpus=2, head_cpus=HEAD_CPUS)
        yield Cluster(hosts, address, keys)
    finally:
        hosts.close()
    assert leftovers(hosts.tag) == [], "namespaces or links left behind"
