"""``--set planner=static colocate=a+b``: a static partition whose parts time-share their pools
(how a static split fits fewer workers than pools), on real worker processes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from pivotflow.config import parse_overrides, resolve
from pivotflow.errors import ConfigError
from pivotflow.graph_check import build_graph, graph_defaults, import_graph_file
from pivotflow.run import plan_workers, run

FAST = ["live=false", "graph.groups_per_step=2", "graph.group_size=4", "planner=static"]


def planned(graph_path: Path, sets: list[str], total: int | None) -> dict[str, str]:
    module = import_graph_file(graph_path)
    cfg = resolve(parse_overrides(sets), graph_defaults(module))
    return plan_workers(build_graph(module, cfg.graph), cfg, total)


def test_workers_spread_over_the_groups(random_genrm_graph: Path) -> None:
    # two workers for three pools: one per group, in each group's first pool
    got = planned(random_genrm_graph, ["planner=static", "colocate=genrm+trainer"], 2)
    assert sorted(got.values()) == ["genrm", "rollout"]
    with pytest.raises(ConfigError, match="static planner needs at least one worker in each"):
        planned(random_genrm_graph, ["planner=static", "colocate=genrm+trainer"], 1)
    # the plain static split still needs a worker in every pool
    with pytest.raises(ConfigError, match="static planner needs at least one worker in each"):
        planned(random_genrm_graph, ["planner=static"], 2)


@pytest.mark.parametrize(
    ("sets", "match"),
    [
        (["colocate=genrm+trainer"], r"only the static planner takes pool groups"),
        (["planner=static", "colocate=genrm+judge"], r"'judge' is not a pool .*rollout"),
        (["planner=static", "colocate=genrm+trainer,trainer"], r"'trainer' is in two groups"),
        (["planner=static", "colocate=genrm+trainer", "pools.genrm=0", "pools.trainer=0"],
         r"colocate group genrm\+trainer has 0 workers"),
    ],
)
def test_bad_colocate_groups_are_clear_errors(random_genrm_graph: Path, sets: list[str],
                                              match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        planned(random_genrm_graph, sets, None)


def test_the_elastic_bench_tries_every_static_deployment(
    random_genrm_graph: Path, bench_script: Callable[[str], ModuleType]
) -> None:
    deployments = bench_script("elastic").static_deployments
    # two workers: each pair of pools time-shares one worker, the third pool gets the other
    two = deployments(2)
    assert sorted(two) == ["static-rollout+genrm:1-trainer:1", "static-rollout+trainer:1-genrm:1",
                           "static-rollout:1-genrm+trainer:1"]
    # three: the plain split, and the three pairings with either part given two workers
    assert len(deployments(3)) == 7 and "static-1-1-1" in deployments(3)
    for sets in [*two.values(), *deployments(3).values()]:  # each one a valid run config
        got = planned(random_genrm_graph, ["planner=static", *sets], None)
        assert len(got) in (2, 3)


def test_a_colocate_group_time_shares_and_loses_nothing(tmp_path: Path,
                                                        random_genrm_graph: Path) -> None:
    result = run(random_genrm_graph, sets=[*FAST, "colocate=genrm+trainer"],
                 out=tmp_path / "out", workers=2, steps=4, console=False)
    summary = result.summary
    assert summary["planner"] == "static"
    assert summary["ledger"]["lost"] == 0 and summary["ledger"]["duplicates"] == 0
    assert summary["ledger"]["groups_trained"] == 8
    shifts = [json.loads(line) for line in (result.out / "shifts.jsonl").read_text().splitlines()]
    # the group's one worker judged, then trained, every step; the rollout worker never moved
    assert len(shifts) >= 4
    assert {(s["from"], s["to"]) for s in shifts} <= {("genrm", "trainer"), ("trainer", "genrm")}
    assert len({s["worker"] for s in shifts}) == 1
    # each timed part by part; the warm-up (engine and KV cache, or the optimizer) is in load
    for s in shifts:
        assert 0 < s["warmup_s"] <= s["load_s"] <= s["total_s"], s
        assert s["release_s"] > 0 and s["drain_s"] is not None
