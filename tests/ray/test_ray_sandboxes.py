"""``sandbox_url="ray"``: the run starts a sandbox server on each node of its Ray cluster that has
CPUs (``rl/ray_sandboxes.py``) at the first program, and the code reward and the code
interpreter tool run their programs there; the servers need the run's token; they end with
their handles; without a cluster it is a one-line error."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from ray_fixtures import FakeCluster, left_on_cluster

from pivotflow.rl.code_reward import code_reward
from pivotflow.run import run
from pivotflow.tools import ToolCall, ToolPool, ToolRegistry
from pivotflow.tools.code_interpreter import code_interpreter

pytestmark = pytest.mark.timeout(240)

ADD = "a, b = map(int, input().split())\nprint(a + b)\n"
SUM = {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}


def test_programs_run_on_a_server_the_run_started_on_each_node(
        ray_cluster: FakeCluster) -> None:
    reward = code_reward("tests", sandbox_url="ray", workers=4)

    async def scores() -> list[float]:
        return list(await asyncio.gather(*(
            reward(f"```python\n{code}```", tests=json.dumps(SUM))
            for code in [ADD, ADD.replace("+", "-")] * 4)))

    assert asyncio.run(scores()) == [1.0, 0.0] * 4
    runner = reward.runner  # (a RemoteRunner: its servers, while the loop runs)
    assert runner.on_ray and runner.endpoints is None  # (ended with the loop: asyncio.run)
    urls, refused = asyncio.run(placed(runner))
    assert len(urls) == len(ray_cluster.nodes) == len(set(urls))  # a server a node with CPUs
    assert refused == 401  # each listens on its node's address, behind the run's token
    # the servers end with the loop that placed them
    deadline = time.monotonic() + 60
    while left_on_cluster()["actors"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left_on_cluster()["actors"] == []


async def placed(runner) -> tuple[list[str], int]:  # noqa: ANN001 (a RemoteRunner)
    """The URLs of the servers ``runner`` places on this loop (they end with it), and the
    status a request without the run's token gets from one while they serve."""
    servers = await runner._servers()
    assert len(runner.ray_actors) == len(servers.urls)
    return list(servers.urls), await asyncio.to_thread(status_without_token, servers.urls[0])


def status_without_token(url: str) -> int:
    request = urllib.request.Request(f"{url}/run_code", method="POST",
                                     data=json.dumps({"code": "print(1)"}).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code


def test_the_code_interpreter_runs_on_the_clusters_servers(ray_cluster: FakeCluster) -> None:
    with ToolPool(ToolRegistry([code_interpreter]), workers=2, timeout_s=5.0,
                  sandbox_url="ray") as pool:
        got = pool.call(ToolCall("code_interpreter", {"code": "print(6 * 7)"}))
    assert (got.kind, got.content) == ("ok", "42\n")


def test_without_a_cluster_it_is_one_line() -> None:
    program = ("import asyncio\nfrom pivotflow.rl.code_reward import code_reward\n"
               "r = code_reward('tests', sandbox_url='ray')\n"
               "try:\n    asyncio.run(r('print(1)', tests='[\"assert True\"]'))\n"
               "except ValueError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == ("sandbox_url='ray' needs a Ray cluster: this process is not "
                                  "connected to one (run with --set launcher=ray, or ray.init "
                                  "first)")


def test_a_code_rl_run_on_the_cluster_judges_every_program_on_its_nodes(
        tmp_path: Path, ray_cluster: FakeCluster,
        script: Callable[[Path], ModuleType]) -> None:
    """examples/code_rl.py for two steps with ``launcher=ray`` and ``graph.sandbox_url=ray``:
    the reward's servers start on the nodes the run's workers run on, every program is judged
    (the outcome shares sum to 1), nothing is lost, and nothing is left on the cluster."""
    example = Path(__file__).resolve().parents[2] / "examples" / "code_rl.py"
    module = script(example)
    model = script(example.with_name("byo_model.py")).build_tiny_folder(tmp_path / "model")
    tasks = module.write_tasks(tmp_path / "tasks.jsonl")
    result = run(example, steps=2, out=tmp_path / "run", console=False,
                 sets=[f"graph.model={model}", f"graph.prompts={tasks}", "live=false",
                       "planner=static", "launcher=ray", "ray.strategy=SPREAD",
                       "graph.sandbox_url=ray"])
    assert result.summary["ledger"]["lost"] == 0 and result.summary["steps"] == 2
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        shares = json.loads(line)["logged_metrics"]
        assert sum(shares[f"code_{k}"] for k in ("ok", "wrong", "error", "timeout",
                                                  "other")) == pytest.approx(1.0)
    deadline = time.monotonic() + 60
    while left_on_cluster() != {"placement_groups": [], "actors": []} \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left_on_cluster() == {"placement_groups": [], "actors": []}
