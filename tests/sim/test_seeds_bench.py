"""``bench/sim_seeds.py``: one planner at several seeds of a workload, with the spread."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from sim_workloads import TINY_DRIFT_TOML


@pytest.mark.timeout(300)
def test_each_seed_is_its_own_run_and_the_spread_covers_them(
    bench_script: Callable[[str], ModuleType], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = bench_script("sim_seeds")
    (tmp_path / "tiny.toml").write_text(TINY_DRIFT_TOML)
    out = tmp_path / "seeds.json"
    assert bench.main([str(tmp_path / "tiny.toml"), "--seeds", "3", "--planner",
                       "backpressure", "--steps", "5", "--out", str(out)]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == last
    [(name, group)] = last["groups"].items()
    assert name == "tiny-drift" and group["seeds"] == [0, 1, 2]
    times = [r["sim_s"] for r in group["runs"]]
    assert len(set(times)) > 1  # the seeds draw different lengths: different runs
    assert group["sim_s"]["min"] == min(times) and group["sim_s"]["max"] == max(times)
    assert group["sim_s_max_over_min"] == pytest.approx(max(times) / min(times), abs=1e-4)
    assert all(r["split"] == group["runs"][0]["split"] for r in group["runs"])  # one split
    # the same seed again is the same run (virtual time: nothing depends on the host)
    again = bench.one_run(str(tmp_path / "tiny.toml"), "backpressure", 1, None, 5)
    assert again["sim_s"] == group["runs"][1]["sim_s"]


def test_a_bad_seed_count_is_one_line(bench_script: Callable[[str], ModuleType],
                                      tmp_path: Path) -> None:
    bench = bench_script("sim_seeds")
    (tmp_path / "tiny.toml").write_text(TINY_DRIFT_TOML)
    with pytest.raises(SystemExit, match=r"--seeds 0: at least 1"):
        bench.main([str(tmp_path / "tiny.toml"), "--seeds", "0"])


@pytest.mark.timeout(300)
def test_baselines_run_at_every_seed_and_the_ratio_is_seed_by_seed(
    bench_script: Callable[[str], ModuleType], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = bench_script("sim_seeds")
    (tmp_path / "tiny.toml").write_text(TINY_DRIFT_TOML)
    assert bench.main([str(tmp_path / "tiny.toml"), "--seeds", "2", "--planner",
                       "backpressure", "--steps", "5", "--against", "static,colocated"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["against"] == ["static", "colocated"]
    group = last["groups"]["tiny-drift"]
    for base in ("static", "colocated"):
        runs, base_runs = group["runs"], group[f"{base}_runs"]
        assert [r["seed"] for r in base_runs] == [0, 1]
        assert {r["planner"] for r in base_runs} == {base}
        want = [round(a["whole_run_samples_per_s"] / b["whole_run_samples_per_s"], 4)
                for a, b in zip(runs, base_runs, strict=True)]
        assert group[f"vs_{base}"]["per_seed"] == want
        assert group[f"vs_{base}"]["min"] == min(want)
        assert group[f"vs_{base}"]["max"] == max(want)
    # the static baseline keeps the planner's starting split; colocated starts as sim_drift does
    assert group["static_runs"][0]["split"] == group["runs"][0]["split"]
    assert group["colocated_runs"][0]["split"]["genrm"] == 1
    assert group["colocated_runs"][0]["shifts"] > 0  # it moves its workers role to role


def test_an_unknown_baseline_is_one_line(bench_script: Callable[[str], ModuleType],
                                         tmp_path: Path) -> None:
    bench = bench_script("sim_seeds")
    (tmp_path / "tiny.toml").write_text(TINY_DRIFT_TOML)
    with pytest.raises(SystemExit, match=r"--planner/--against 'statc': not a planner"):
        bench.main([str(tmp_path / "tiny.toml"), "--against", "statc"])
