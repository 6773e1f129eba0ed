"""pivotflow on a Ray cluster across two namespace hosts (10.77.0.1 and 10.77.0.2, a veth pair,
each its own /dev/shm): the driver and the Ray head on A, a Ray worker node on B. Unlike the
fake cluster in tests/ray (every node on one loopback, one /dev/shm), an address, bind, key or
store-path mistake that only shows with two IPs and two stores fails here."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest
from netns_hosts import Cluster, Host, ray_env

pytestmark = pytest.mark.timeout(420)

ROOT = Path(__file__).resolve().parents[2]
GRAPH = ROOT / "graphs" / "grpo_genrm.py"
FAST = ["live=false", "graph.groups_per_step=2", "graph.group_size=4", "planner=static",
        "launcher=ray", "ray.strategy=SPREAD"]


def run_on_a(cluster: Cluster, out: Path, steps: int, extra: list[str] = ()) -> dict:
    """``pivotflow run`` as the driver on host A; its summary.json (A shares /tmp with us)."""
    sets = [*FAST, f"ray.address={cluster.address}", f"curve_keys={cluster.keys}", *extra]
    done = cluster.hosts.a.run([sys.executable, "-m", "pivotflow.cli", "run", str(GRAPH),
                                "--out", str(out), "--steps", str(steps),
                                *[f"--set={s}" for s in sets]],
                               env=ray_env(), timeout=360, check=False)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    return json.loads((out / "summary.json").read_text())


def run_tag_shm(host: Host, out: Path) -> list[str]:
    """The run's store copies left in ``host``'s /dev/shm."""
    return [e for e in host.shm_entries() if e.startswith(f"pivotflow-{out.name}")]


def test_a_run_across_two_hosts_crosses_weights_between_their_stores(
        tmp_path: Path, two_hosts: Cluster) -> None:
    out = tmp_path / "out"
    s = run_on_a(two_hosts, out, steps=3)
    assert s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert s["ledger"]["groups_trained"] == s["ledger"]["prompts_in"] == 6
    assert s["worker_restarts"] == 0
    r = s["ray"]
    assert r["nodes_used"] == 2 and r["bundles"] == 3 and r["node_failures"] == 0
    st = r["stores"]
    assert st["nodes"] == st["roots"] == 2  # A's (the run's own store) and B's
    by_rank = {n["rank"]: n for n in st["by_node"].values()}
    a_store, b_store = by_rank[0], by_rank[1]
    # workers on both hosts, each reading its own host's store
    on_b = [w for w, root in st["workers"].items() if root == b_store["root"]]
    on_a = [w for w, root in st["workers"].items() if root == a_store["root"]]
    assert on_a and on_b, st["workers"]
    # the initial versions went A -> B; whatever the trainer's host published crossed back
    assert b_store["received"]["policy"][0] == 0 or a_store["received"]["policy"][0] == 0
    trained = a_store["sent"].get("policy", []) + b_store["sent"].get("policy", [])
    assert set(trained) >= {0, 1, 2, 3}
    assert st["bytes_crossed"] > 0 and all(not n["failures"] for n in by_rank.values())
    # the controller listened on A's address, with CurveZMQ (admission by keys, no token)
    assert not s["admission"]["tokens_required"]
    assert run_tag_shm(two_hosts.hosts.a, out) == run_tag_shm(two_hosts.hosts.b, out) == []
    logs = sorted(p.name for p in (out / "logs").iterdir() if p.name != "controller.log")
    assert len(logs) == 3  # B's worker log came back to the run folder on A


def kill_b_after(cluster: Cluster, out: Path, step: int, done: dict) -> None:
    records = out / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if records.is_file() and len(records.read_text().splitlines()) >= step:
            break
        time.sleep(0.1)
    done["at_step"] = len(records.read_text().splitlines()) if records.is_file() else -1
    done["killed"] = cluster.hosts.kill_host(cluster.hosts.b)


def test_host_b_killed_mid_run_the_run_completes_on_a(tmp_path: Path,
                                                      two_hosts: Cluster) -> None:
    """Last in this module: B's raylet and every process on B SIGKILLed after step 2."""
    out = tmp_path / "out"
    done: dict = {}
    killer = threading.Thread(target=kill_b_after, args=(two_hosts, out, 2, done), daemon=True)
    killer.start()
    s = run_on_a(two_hosts, out, steps=6)
    killer.join(10)
    assert done.get("killed") and 0 < done["at_step"] < 6, done
    assert s["ray"]["node_failures"] == 1
    assert s["worker_restarts"] >= 1
    assert s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert s["ledger"]["groups_trained"] == s["ledger"]["prompts_in"] == 12
    assert s["steps"] == 6
    assert run_tag_shm(two_hosts.hosts.a, out) == []
