"""Sandbox servers on a Ray cluster's nodes, started by the run itself: ``sandbox_url="ray"``.

``code_reward(..., sandbox_url="ray")`` and a tool pool's ``{"sandbox_url": "ray"}``
(``code_interpreter``) need no servers started by hand: at their first program,
``start_on_nodes`` puts a ``SandboxHost`` actor on every alive node that has CPUs (Ray's
``NodeAffinitySchedulingStrategy``, ``num_cpus=0``: it takes no worker's slot), and each serves
the code sandbox (``sandbox_server.listening``, on a thread of its own) on that node's address,
as many sandboxes as the node has CPUs, behind a token drawn for this run (the servers listen
off loopback: only the run's own client may use them). The programs are then spread over the
nodes as ``RemoteRunner`` spreads them over any servers (in turn, each request retried on the
next).

The actors belong to the driver that started them: they end with it (Ray kills a driver's
actors when it exits), and their sandboxes with them (bubblewrap's ``--die-with-parent``). A
node that joins later gets none (decision: the servers are placed once, at the first program);
a node lost takes its server away, and its requests go to the next (``retries``).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

START_TIMEOUT_S = 120.0  # a node's actor and its server: a worker process's start on Ray


class SandboxHost:
    """A Ray actor: the code sandbox served over HTTP on its node (``sandbox_server``)."""

    def __init__(self, workers: int, memory_mb: int, token: str, isolation: str) -> None:
        import ray

        from pivotflow.rl.sandbox_server import listening, server_runner

        self.url = ""
        self.error = ""
        ready = threading.Event()
        host = ray.util.get_node_ip_address()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            try:
                runner = server_runner(workers, memory_mb, isolation)
                _, self.url = loop.run_until_complete(listening(host, 0, runner, True, token))
            except (ValueError, OSError) as why:  # no bubblewrap there, no port
                self.error = f"sandbox server on {host}: {why}"
                ready.set()
                return
            ready.set()
            loop.run_forever()

        threading.Thread(target=serve, name="pivotflow-sandbox-server", daemon=True).start()
        ready.wait(START_TIMEOUT_S)

    def address(self) -> tuple[str, str]:
        """(the URL it serves on, or "" with the error that kept it from serving)."""
        return self.url, self.error


def start_on_nodes(memory_mb: int, token: str, isolation: str = "bwrap") -> tuple[list[str],
                                                                                  list[Any]]:
    """A ``SandboxHost`` on each alive node with CPUs: (their URLs, the actors, which must be
    kept referenced: an actor no handle holds is gone). Raises ValueError (one line) where this
    process is not connected to Ray, no node has CPUs, or a node's server could not start."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        raise ValueError("sandbox_url='ray' needs a Ray cluster: this process is not connected "
                         "to one (run with --set launcher=ray, or ray.init first)")
    nodes = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) > 0]
    if not nodes:
        raise ValueError("sandbox_url='ray': no alive node of the cluster has CPUs")
    host_cls: Any = ray.remote(num_cpus=0)(SandboxHost)
    actors = [host_cls.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
    ).remote(max(1, int(n["Resources"]["CPU"])), memory_mb, token, isolation) for n in nodes]
    addresses = ray.get([a.address.remote() for a in actors], timeout=START_TIMEOUT_S)
    failed = [error or "no answer" for url, error in addresses if not url]
    if failed:
        for actor in actors:
            ray.kill(actor)
        raise ValueError(f"sandbox_url='ray': {failed[0]}")
    return [url for url, _ in addresses], actors
