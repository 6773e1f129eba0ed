"""``bench/sim_levers.py``: each lever changes one thing for one run and undoes it, and the
JSON sets every lever's run beside the shipped one."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from sim_workloads import TINY_DRIFT_TOML


@pytest.mark.timeout(300)
def test_levers_run_beside_the_shipped_run_and_leave_nothing_changed(
    bench_script: Callable[[str], ModuleType], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = bench_script("sim_levers")
    import pivotflow.planner.backpressure as bp
    import pivotflow.sim.cluster as cluster
    from pivotflow.sim.cost_model import CostModel

    before = (CostModel.train_s, CostModel.train_world_s, cluster.role_options, bp.TAIL_FILL,
              bp.BackpressurePlanner._best_move, bp.BackpressurePlanner._size_trainers)
    (tmp_path / "tiny.toml").write_text(TINY_DRIFT_TOML)
    levers = ["train=0.25", "rollout_batch=0.02", "tail_fill=0.5", "blocks=0", "lending=0"]
    # (held at its early regime: the tiny file's first step)
    args = [str(tmp_path / "tiny.toml"), "--at", "0", "--steps", "5", "--planner", "static",
            "--split", "3,3,2"]
    assert bench.main(args + [a for lever in levers for a in ("--lever", lever)]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    after = (CostModel.train_s, CostModel.train_world_s, cluster.role_options, bp.TAIL_FILL,
             bp.BackpressurePlanner._best_move, bp.BackpressurePlanner._size_trainers)
    assert after == before  # every lever undone
    shipped, got = last["shipped"], last["levers"]
    assert set(got) == set(levers)
    # a static split with shorter steps finishes sooner, with a few slots a rollout worker later
    assert got["train=0.25"]["sim_s"] < shipped["sim_s"]
    assert got["rollout_batch=0.02"]["sim_s"] > shipped["sim_s"]
    for item in levers:
        assert got[item]["over_shipped"] == round(
            got[item]["samples_per_s"] / shipped["samples_per_s"], 4)
    # the planner's levers do nothing to a static split: the same run
    for item in ("tail_fill=0.5", "blocks=0", "lending=0"):
        assert got[item]["sim_s"] == shipped["sim_s"]


def test_an_unknown_lever_is_one_clear_error(
    bench_script: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    bench = bench_script("sim_levers")
    (tmp_path / "tiny.toml").write_text(TINY_DRIFT_TOML)
    with pytest.raises(SystemExit, match="--lever warp=2.0: unknown lever; one of train"):
        bench.main([str(tmp_path / "tiny.toml"), "--planner", "static", "--split", "3,3,2",
                    "--lever", "warp=2"])
