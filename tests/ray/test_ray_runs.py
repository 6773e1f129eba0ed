"""Runs on a fake two-node Ray cluster (real raylets, real worker processes, loopback): workers
placed on both nodes, the trainers' group rendezvousing over TCP, every version crossing to each
node's own store, and a node that vanishes mid-run taking its worker (and its store agent) with
it while the run goes on and loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from ray_fixtures import FakeCluster, left_on_cluster, listening_addresses, worker_pid

from pivotflow import checkpoints
from pivotflow.errors import ConfigError
from pivotflow.launch.ray_host import log_root
from pivotflow.metrics import read_metrics
from pivotflow.run import run

pytest.importorskip("ray")
pytestmark = pytest.mark.timeout(300)

GRAPH = Path(__file__).resolve().parents[2] / "graphs" / "grpo_rule.py"
FAST = ["live=false", "graph.groups_per_step=2", "graph.group_size=4", "launcher=ray",
        "ray.strategy=SPREAD"]


def test_the_cluster_listens_on_loopback_only(ray_cluster: FakeCluster) -> None:
    found = listening_addresses()
    assert found and found <= {"127.0.0.1", "::1"}, found


def test_bundles_the_cluster_cannot_place_are_a_clear_error(tmp_path: Path,
                                                            ray_cluster: FakeCluster) -> None:
    with pytest.raises(ConfigError, match=r"the cluster did not place 2 workers of "
                                          r"\{'CPU': 8.0\} \(SPREAD\) in 3 s") as err:
        run(GRAPH, sets=[*FAST, "ray.cpus_per_worker=8", "ray.place_timeout_s=3"],
            out=tmp_path / "out", steps=2, console=False)
    assert "\n" not in str(err.value)
    assert left_on_cluster() == {"placement_groups": [], "actors": []}


def test_a_run_on_two_nodes_with_a_trainer_group_over_tcp(tmp_path: Path,
                                                          ray_cluster: FakeCluster) -> None:
    """The two trainers shard AdamW's state (``zero_stage=1``): each publishes its shard on its
    own node, and the controller's checkpoint joins the two from its node's store."""
    result = run(GRAPH, sets=[*FAST, "pools.trainer=2", "planner=static", "graph.zero_stage=1"],
                 out=tmp_path / "out", steps=3, console=False)
    s = result.summary
    ckpt, _ = checkpoints.newest_whole(result.out)
    assert ckpt is not None and ckpt.optimizer is not None
    assert {float(v) for k, v in ckpt.optimizer.items() if k.endswith(".step")} == {3.0}
    assert s["launcher"] == "ray"
    assert s["ray"]["nodes_used"] == 2 and s["ray"]["bundles"] == 3
    assert s["ray"]["rendezvous"] >= 1  # two trainers: a TCPStore on rank 0's node
    assert s["ledger"]["groups_trained"] == s["ledger"]["prompts_in"] == 6
    assert s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert s["worker_restarts"] == 0
    # on a cluster of this host only, a Hello needs the run's token, handed over by file
    assert s["admission"]["tokens_required"] and s["admission"]["refused_hellos"] == 0
    # (named by the run: other sessions' runs may hold theirs now)
    assert not list(Path(tempfile.gettempdir()).glob(f"pivotflow-run-secret-out-{os.getpid()}-*"))
    logs = sorted(p.name for p in (result.out / "logs").iterdir() if p.name != "controller.log")
    assert logs == ["w0-rollout.log", "w1-trainer.log", "w2-trainer.log"]
    assert not log_root(f"out-{os.getpid()}").exists()  # the nodes' copies went
    assert left_on_cluster() == {"placement_groups": [], "actors": []}


def no_store_left() -> list[str]:
    """The run's store copies left in shared memory (none after a run: each node's agent
    removes its copy, and a lost node's is swept by the agents that remain)."""
    return [p.name for p in Path("/dev/shm").glob(f"pivotflow-out-{os.getpid()}*")]


def test_every_version_crosses_to_the_rollout_nodes_own_store(tmp_path: Path,
                                                              ray_cluster: FakeCluster) -> None:
    """The trainer on one node publishes into its node's store; the rollout worker on the other
    reads only its own node's root, so each version it generated with had crossed there."""
    result = run(GRAPH, sets=[*FAST, "planner=static"], out=tmp_path / "out", steps=3,
                 console=False)
    s = result.summary
    assert s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert s["ledger"]["groups_trained"] == s["ledger"]["prompts_in"] == 6
    st = s["ray"]["stores"]
    assert st["nodes"] == st["roots"] == 3  # the controller's and one per worker node
    roots = st["workers"]
    assert roots["w0-rollout"] != roots["w1-trainer"]
    by_root = {n["root"]: n for n in st["by_node"].values()}
    rollout, trainer = by_root[roots["w0-rollout"]], by_root[roots["w1-trainer"]]
    head = next(n for n in st["by_node"].values() if n["rank"] == 0)
    assert head["root"] not in roots.values()  # the controller's node holds no worker
    # the initial version from the controller's store to both nodes; each trained one from
    # the trainer's node to the rollout node's (the ones it generated with) and the head's
    assert rollout["received"]["policy"][0] == trainer["received"]["policy"][0] == 0
    assert trainer["sent"]["policy"] == [1, 2, 3]
    assert set(rollout["received"]["policy"]) >= {0, 1}
    assert head["received"]["policy"] == [1, 2, 3]
    assert st["cross_s_median"] is not None and st["cross_s_median"] < 10
    assert all(not n["failures"] for n in st["by_node"].values())
    assert no_store_left() == []
    assert left_on_cluster() == {"placement_groups": [], "actors": []}


def test_chaos_kills_on_the_cluster_lose_nothing(tmp_path: Path,
                                                 ray_cluster: FakeCluster) -> None:
    """Chaos kills go through the host actors; each replacement takes the freed bundle."""
    result = run(GRAPH, sets=[*FAST, "planner=static", "chaos.kill_worker_every_steps=2"],
                 out=tmp_path / "out", steps=6, console=False)
    s = result.summary
    assert s["chaos_kills"] >= 2
    assert s["worker_restarts"] >= s["chaos_kills"] - s["chaos_kills_unseen"]
    assert s["ray"]["node_failures"] == 0
    assert s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert s["ledger"]["groups_trained"] == s["ledger"]["prompts_in"] == 12
    killed = [p for p in (tmp_path / "out" / "logs").iterdir() if "~r" in p.name]
    assert killed, "the replacements' logs are in the run folder"
    assert not log_root(f"out-{os.getpid()}").exists()
    assert left_on_cluster() == {"placement_groups": [], "actors": []}


def stop_a_worker_after(out: Path, worker_id: str, step: int) -> None:
    """SIGSTOP ``worker_id``'s process (the fake nodes share this host) once ``step`` steps
    are recorded: it lives on, silent."""
    records = out / "metrics.jsonl"
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline and not (
            records.is_file() and len(records.read_text().splitlines()) >= step):
        time.sleep(0.1)
    pid = worker_pid(worker_id)
    if pid is not None:
        os.kill(pid, signal.SIGSTOP)


def test_a_silent_worker_is_replaced_in_its_own_bundle(tmp_path: Path,
                                                       ray_cluster: FakeCluster) -> None:
    """Declared dead by its heartbeat while its process lives (stopped): the launcher kills
    it through its host actor, and the replacement takes that bundle."""
    out = tmp_path / "out"
    stopper = threading.Thread(target=stop_a_worker_after, args=(out, "w0-rollout", 2),
                               daemon=True)
    stopper.start()
    # 15 s of silence: well over a loaded worker's gap between 1 s heartbeats (sent from a
    # thread of their own), and half the wait the test first had (30 s of its 42)
    result = run(GRAPH, sets=[*FAST, "planner=static", "worker_timeout_s=15"], out=out,
                 steps=5, console=False)
    stopper.join(10)
    s = result.summary
    assert s["worker_restarts"] >= 1 and s["ray"]["node_failures"] == 0
    assert s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert s["ledger"]["groups_trained"] == s["ledger"]["prompts_in"] == 10
    assert (out / "logs" / "w0-rollout~r1.log").is_file()
    assert left_on_cluster() == {"placement_groups": [], "actors": []}


def remove_a_node_after(out: Path, cluster: FakeCluster, step: int, done: dict,
                        worker: str = "") -> None:
    """Once ``step`` steps are recorded, remove a node that holds one of the run's bundles
    (``worker``'s node, when named)."""
    import ray

    deadline = time.monotonic() + 200
    records = out / "metrics.jsonl"
    while time.monotonic() < deadline:
        if records.is_file() and len(records.read_text().splitlines()) >= step:
            break
        time.sleep(0.1)
    [group] = [g for g in ray.util.placement_group_table().values()
               if g["state"] == "CREATED" and g["name"].startswith("pivotflow-")]
    node = group["bundles_to_node_id"][0]
    pid = worker_pid(worker) if worker else None
    node = (cluster.node_of_pid(pid) if pid else None) or node
    done["at_step"] = len(records.read_text().splitlines())
    cluster.remove_node(node)
    done["node"] = node


def test_a_node_removed_mid_run_loses_nothing(tmp_path: Path,
                                              ray_cluster: FakeCluster) -> None:
    """The trainer's node goes right after a step: the version it just published must have
    reached another node before that step was reported (the replacement loads it there)."""
    out = tmp_path / "out"
    done: dict = {}
    remover = threading.Thread(target=remove_a_node_after,
                               args=(out, ray_cluster, 2, done, "w1-trainer"), daemon=True)
    remover.start()
    result = run(GRAPH, sets=[*FAST, "planner=static"], out=out, steps=6, console=False)
    remover.join(10)
    s = result.summary
    assert "node" in done and done["at_step"] < 6, done  # it went mid-run
    assert s["ray"]["node_failures"] == 1
    assert s["worker_restarts"] >= 1  # its worker, replaced on the node that remains
    assert s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert s["ledger"]["groups_trained"] == s["ledger"]["prompts_in"] == 12
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, 7))
    lost_logs = [p.read_text() for p in (out / "logs").iterdir()]
    assert any("left the cluster" in text for text in lost_logs)
    # the lost node's store agent went with it: the others re-formed their group and the
    # controller's store still got every step's version
    st = s["ray"]["stores"]
    assert st["reforms"] >= 2
    head = next(n for n in st["by_node"].values() if n.get("rank") == 0)
    assert head["received"]["policy"][-1] == 6
    assert no_store_left() == []
    assert left_on_cluster() == {"placement_groups": [], "actors": []}


def test_a_node_that_joins_later_takes_the_lost_bundle(tmp_path: Path,
                                                       ray_cluster: FakeCluster) -> None:
    """From the command line, as a user runs it (the run in its own process, so that this
    one's main thread can add a node: Ray starts nodes only from a main thread)."""
    import ray

    while len(ray_cluster.nodes) < 2:  # an earlier test removed one
        ray_cluster.add_node()
    out = tmp_path / "out"
    # a bundle of 2 CPUs: each node holds one worker, none has room for the lost one's
    sets = [*FAST, "planner=static", "ray.cpus_per_worker=2",
            f"ray.address={ray_cluster.address}"]
    proc = subprocess.Popen([sys.executable, "-m", "pivotflow.cli", "run", str(GRAPH),
                             "--out", str(out), "--steps", "5",
                             *[f"--set={s}" for s in sets]],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        done: dict = {}
        remove_a_node_after(out, ray_cluster, 2, done)
        time.sleep(3)
        [group] = [g for g in ray.util.placement_group_table().values()
                   if g["name"].startswith("pivotflow-") and g["state"] != "REMOVED"]
        assert group["state"] == "RESCHEDULING"  # no room: the lost bundle waits
        ray_cluster.add_node()
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["ray"]["node_failures"] == 1 and s["ray"]["nodes_used"] == 3
    assert s["worker_restarts"] >= 1
    assert s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert s["ledger"]["groups_trained"] == s["ledger"]["prompts_in"] == 10
    assert s["ray"]["stores"]["nodes"] == 4  # the head's, two first nodes', the one that joined
    assert not list(Path("/dev/shm").glob(f"pivotflow-out-{proc.pid}*"))  # no copy left
    assert left_on_cluster() == {"placement_groups": [], "actors": []}


def test_ppo_on_two_nodes_carries_the_critic_to_every_node(tmp_path: Path,
                                                          ray_cluster: FakeCluster) -> None:
    """PPO's four pools on two nodes: the trainer publishes the critic with each policy version
    into its node's store, and every version crosses to the controller's store (its
    checkpoints) and to the critic worker's node when that is another one."""
    out = tmp_path / "out"
    sets = ["live=false", "graph.groups_per_step=8", "launcher=ray", "ray.strategy=SPREAD",
            "planner=static"]
    result = run(Path(__file__).resolve().parents[2] / "graphs" / "ppo_genrm.py", sets=sets,
                 out=out, steps=3, console=False)
    s = result.summary
    assert s["error"] is None and s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert s["ledger"]["samples_trained"] == 3 * 8
    st = s["ray"]["stores"]
    roots = st["workers"]
    by_root = {n["root"]: n for n in st["by_node"].values()}
    head = next(n for n in st["by_node"].values() if n["rank"] == 0)
    assert head["received"]["critic"] == [1, 2, 3]
    assert head["received"]["critic.optim"][-1] == 3
    if roots["w2-values"] != roots["w3-trainer"]:  # (SPREAD: two of the four on each node)
        assert 1 in by_root[roots["w2-values"]]["received"]["critic"]
    last = checkpoints.read(checkpoints.latest(out) or out)
    assert last.step == 3 and last.critic_optimizer is not None
    assert {float(v) for k, v in last.critic_optimizer.items() if k.endswith(".step")} == {3.0}
    assert no_store_left() == []
    assert left_on_cluster() == {"placement_groups": [], "actors": []}
