"""pivotflow on a fake two-node Ray cluster (``ray.cluster_utils.Cluster`` on this host: a head
with ``num_cpus=0`` and two nodes of 2 logical CPUs, each node its own store root under
/dev/shm and its own store agent), in one JSON line: issue 23's "Measured". The fake nodes
share this host's 2 cores, one loopback and one /dev/shm; nothing crosses a wire.

1. The store across nodes, a 100M-parameter fp32 version (400 MB), two ways, beside one local
   memcpy of the same bytes (``memcpy_*``):
   * ``store_sync_*``: ``bench/store_sync.measure``, run first, before any raylet: two bare
     processes, each its own store root, ``node_sync.VersionSync`` over gloo on a loopback TCP
     rendezvous (first broadcast -> published in the receiver's store);
   * ``store_agents_*``: on the cluster, the run's machinery (``launch/ray_stores.NodeStores``:
     an agent on each worker node and on the controller's): the version published into node
     A's store, timed by node B's agent (``cross_s``: A's LATEST written -> whole and published
     in B's store; the same broadcast also fills the controller's node). Includes up to one
     poll (``poll_s``), the agents' inventory round and the publish on B.
2. Shifts on both nodes: graphs/grpo_genrm.py, 4 workers, ``planner=static
   colocate=rollout+genrm pools.trainer=1``, SPREAD: one trainer, and three inference workers
   that time-share the rollout and genrm pools in phases, so every step each of them shifts
   genrm -> rollout (loading the policy the trainer just published) and back (loading the
   judge, version 0, on every node since the start). Each node holds two bundles, so one
   inference worker shares the trainer's node and two do not. Timed: each shift's
   ``ShiftRecord`` as the run writes it (``shifts.jsonl``): ``total_s`` (the controller's
   AssignRole sent -> its RoleReady back) and ``load_s`` (the worker's own load of the new
   role from its node's store, engine built); grouped by whether the worker's store root is
   the trainer's (``summary.ray.stores.workers``): medians of each group and their difference
   (``shift_cross_extra_s``, into the rollout pool), the count of each kind
   (``shift_counts``), quartiles under ``shift_run.by_kind``.
   What that difference is, by design: a trainer reports its step only once the step's
   version is on every node (``node_agent.wait_crossed``), and a shift into the rollout pool
   follows that report (``shifts_into_rollout_after_a_step`` of ``shifts_into_rollout``;
   ``shift_after_step_s_median``: the gap from the step's record to the shift), so a
   cross-node shift finds the version already in its own node's copy and loads it locally, as
   a same-node one does. The crossing is not skipped but paid earlier, once per version,
   inside the trainer's step: ``crossing_s_median``/``_max`` (the agents' publish on one node
   -> visible on another, this run's versions of the built-in model: the policy and its AdamW
   state) is what a cross-node shift would add if it waited for the weights itself, and
   ``store_agents_cross_s`` the same for a 100M-parameter version. No shift here loads
   weights still on the other node, because the controller never orders one; none is forced.
3. A node removed mid-run: ``bench/ray_launch.node_loss_run`` (graphs/grpo_rule.py, SPREAD,
   the node of the placement group's first bundle removed after step 2); ``lost``,
   ``duplicates``, ``worker_restarts``, ``node_failures`` at the top level are that run's.

What a real GPU cluster changes: the bytes cross a network (InfiniBand or RoCE) instead of
loopback TCP through one kernel on cores the sender, the receiver and every worker share here, so ``store_*_gb_s`` is no estimate of a cluster's rate, only of the
code's overhead over a memcpy on this host. The agents still use gloo on host memory (each
node's /dev/shm store) on any cluster today: NCCL for GPU-resident versions is the next step
(docs/multi_node.md), and the trainers' gloo group would move to NCCL with it. The crossing
stays inside the trainer's step (bytes / link rate plus a poll) and the shift a local load on
either node, so a cross-node shift should still cost what a same-node one does. A real node
lost is found by Ray's health checks (seconds), not at once as ``remove_node`` is here.

    python bench/ray_cluster.py [--shift-steps 8] [--steps 6] [--params 100000000]
        [--out bench/results/ray_cluster.json]

Needs ray (pip install 'pivotflow[ray]'). About 2.5 minutes here. The last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray_launch  # a sibling file (sets the Ray environment on import)
import store_sync

GENRM = ray_launch.ROOT / "graphs" / "grpo_genrm.py"
SHIFT_SETS = [*ray_launch.FAST, "colocate=rollout+genrm", "pools.trainer=1", "launcher=ray",
              "ray.strategy=SPREAD"]
SHIFT_WORKERS = 4  # two bundles of one CPU on each node of two: the trainer shares its node


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 4) if xs else None


def agents_crossing(params: int, repeats: int = 2) -> dict[str, Any]:
    """A ``params``-parameter fp32 version published into one worker node's store, and the
    time until the store agents (``launch/ray_stores.NodeStores``: one per node and the
    controller's) have it whole in the other worker node's store: that agent's ``cross_s``
    (the version's LATEST written on node A -> published on node B), ``repeats`` versions."""
    import ray
    import torch

    from pivotflow.launch.ray_stores import NodeStores
    from pivotflow.params.node_agent import OWNER_FILE
    from pivotflow.params.shm_store import ShmParamStore, default_root

    a, b = sorted(n["NodeID"] for n in ray.nodes()
                  if n["Alive"] and n["Resources"].get("CPU", 0) > 0)
    tag = f"bench-agents-{os.getpid()}"
    head = ShmParamStore(default_root(tag))  # the controller's store, as run.py makes it
    (head.root / OWNER_FILE).write_text(str(os.getpid()))
    stores = NodeStores(tag, str(head.root))
    try:
        t0 = time.perf_counter()
        stores.ensure({a, b})
        formed_s = time.perf_counter() - t0
        on_a, latest_b = ShmParamStore(stores.roots[a]), Path(stores.roots[b]) / "w" / "LATEST"
        g = torch.Generator().manual_seed(0)
        for version in range(1, repeats + 1):
            tensors = {f"w{i}": torch.randn(params // 4, generator=g) for i in range(4)}
            on_a.publish("w", version, tensors, {"model_type": "bench"})
            del tensors
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if int(latest_b.read_text()) >= version:
                        break
                except (OSError, ValueError):
                    pass
                time.sleep(0.01)
        deadline = time.monotonic() + 30  # B's agent notes the time just after its publish
        while True:
            got = ray.get(stores.agents[b].stats.remote(), timeout=30)
            if len(got["cross_s"]) >= repeats or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        stores.stop()
        head.cleanup()
    cross = got["cross_s"]
    return {"params": params, "bytes": params * 4, "versions": repeats,
            "received_on_b": got["received"].get("w", []), "cross_s": cross,
            "cross_s_min": round(min(cross), 3) if cross else None,
            "gb_s": round(params * 4 / min(cross) / 1e9, 3) if cross else None,
            "group_formed_s": round(formed_s, 2), "poll_s": stores.poll_s}


def shift_run(out: Path, steps: int) -> dict[str, Any]:
    """graphs/grpo_genrm.py on the cluster with inference workers that shift every step; each
    recorded shift grouped by whether its worker's node is the trainer's."""
    from pivotflow.run import run

    result = run(GENRM, sets=SHIFT_SETS, out=out, workers=SHIFT_WORKERS, steps=steps,
                 console=False)
    s = result.summary
    pools = json.loads((out / "config.json").read_text())["workers"]
    stores = s["ray"]["stores"]
    roots = stores["workers"]  # worker -> its node's store root
    [trainer] = [w for w, pool in pools.items() if pool == "trainer"]
    steps_at = [json.loads(line)["time_s"]
                for line in (out / "metrics.jsonl").read_text().splitlines()]
    shifts = [json.loads(line) for line in (out / "shifts.jsonl").read_text().splitlines()]
    groups: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for rec in shifts:
        where = "same_node" if roots.get(rec["worker"]) == roots[trainer] else "cross_node"
        groups.setdefault(rec["to"], {}).setdefault(where, []).append(rec)

    def part(recs: list[dict[str, Any]], key: str) -> float | None:
        return _median([r[key] for r in recs if r[key] is not None])

    def quartiles(recs: list[dict[str, Any]]) -> list[float] | None:
        xs = [r["total_s"] for r in recs if r["total_s"] is not None]
        return [round(q, 4) for q in statistics.quantiles(xs, n=4)] if len(xs) > 1 else None

    by_kind = {to: {where: {"count": len(recs), "total_s_median": part(recs, "total_s"),
                            "total_s_quartiles": quartiles(recs),
                            "load_s_median": part(recs, "load_s"),
                            "warmup_s_median": part(recs, "warmup_s"),
                            "drain_s_median": part(recs, "drain_s")}
                    for where, recs in sorted(g.items())}
               for to, g in sorted(groups.items())}
    into_rollout = [r for g in groups.get("rollout", {}).values() for r in g]
    after = [r["time_s"] - max(t for t in steps_at if t <= r["time_s"]) for r in into_rollout
             if any(t <= r["time_s"] for t in steps_at)]
    return {"steps": s["steps"], "lost": s["ledger"]["lost"],
            "duplicates": s["ledger"]["duplicates"], "worker_restarts": s["worker_restarts"],
            "nodes_used": s["ray"]["nodes_used"],
            "workers_on_trainer_node": sorted(w for w, r in roots.items()
                                              if r == roots[trainer] and w != trainer),
            "workers_on_other_node": sorted(w for w, r in roots.items()
                                            if r != roots[trainer]),
            "shifts": len(shifts), "by_kind": by_kind, "into_rollout": len(into_rollout),
            "into_rollout_after_a_step": len(after),
            "shift_after_step_s_median": _median(after),
            "shift_after_step_s_min": round(min(after), 4) if after else None,
            "crossing_s_median": stores["cross_s_median"],
            "crossing_s_max": stores["cross_s_max"],
            "versions_crossed": stores["versions_crossed"],
            "bytes_crossed": stores["bytes_crossed"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shift-steps", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6, help="of the node-loss run")
    ap.add_argument("--params", type=int, default=100_000_000)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    t_bench = time.perf_counter()
    sync = store_sync.measure(args.params)  # before the raylets: it wants both cores
    import ray

    t0 = time.perf_counter()
    cluster = ray_launch.fake_cluster(nodes=2, cpus=2)
    cluster_up_s = time.perf_counter() - t0
    tmp = Path(tempfile.mkdtemp(prefix="pivotflow-bench-ray-cluster-"))
    try:
        agents = agents_crossing(args.params)
        shifted = shift_run(tmp / "shifts", args.shift_steps)
        node_loss = ray_launch.node_loss_run(cluster, tmp / "node-loss", args.steps)
    finally:
        ray.shutdown()
        cluster.shutdown()
    rollout = shifted["by_kind"].get("rollout", {})
    same, cross = rollout.get("same_node", {}), rollout.get("cross_node", {})
    both = bool(same.get("count") and cross.get("count"))

    def diff(key: str) -> float | None:
        return (round(cross[key] - same[key], 4)
                if both and cross.get(key) is not None and same.get(key) is not None else None)

    result = {
        "bench": "ray_cluster", "ray_version": ray.__version__, "cpus": os.cpu_count(),
        "nodes": 2, "cluster_up_s": round(cluster_up_s, 2),
        # the node-loss run's (graphs/grpo_rule.py, a node removed after step 2)
        "lost": node_loss["lost"], "duplicates": node_loss["duplicates"],
        "worker_restarts": node_loss["worker_restarts"],
        "node_failures": node_loss["node_failures"],
        "node_loss": node_loss,
        # the store across nodes: a 100M-parameter fp32 version beside a local memcpy
        "store_params": sync["params"], "store_bytes": sync["bytes"],
        "store_transport": sync["transport"],
        "store_sync_s": sync["sync_s"], "store_sync_gb_s": sync["sync_gb_s"],
        "memcpy_s": sync["memcpy_s"], "memcpy_gb_s": sync["memcpy_gb_s"],
        "store_sync_over_memcpy": sync["sync_over_memcpy"],
        # the same bytes through the store agents on the cluster (node A's store -> node B's)
        "store_agents_cross_s": agents["cross_s_min"], "store_agents_gb_s": agents["gb_s"],
        "store_agents_over_memcpy": (round(agents["cross_s_min"] / sync["memcpy_s"], 1)
                                     if agents["cross_s_min"] else None),
        "store_agents": agents,
        # shifts into the rollout pool (the policy just trained), by the worker's node
        "shift_counts": {f"{to}_{where}": k["count"]
                         for to, g in shifted["by_kind"].items() for where, k in g.items()},
        "shift_on_both_nodes": both,
        "shift_same_node_s_median": same.get("total_s_median"),
        "shift_cross_node_s_median": cross.get("total_s_median"),
        "shift_cross_extra_s": diff("total_s_median"),
        "shift_load_same_node_s_median": same.get("load_s_median"),
        "shift_load_cross_node_s_median": cross.get("load_s_median"),
        "shift_load_cross_extra_s": diff("load_s_median"),
        # started after a step's report, so after that step's version was on every node
        "shifts_into_rollout": shifted["into_rollout"],
        "shifts_into_rollout_after_a_step": shifted["into_rollout_after_a_step"],
        "shift_after_step_s_median": shifted["shift_after_step_s_median"],
        "crossing_s_median": shifted["crossing_s_median"],
        "crossing_s_max": shifted["crossing_s_max"],
        "shift_run": shifted,
    }
    result["bench_s"] = round(time.perf_counter() - t_bench, 1)
    line = json.dumps(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    sys.exit(main())
