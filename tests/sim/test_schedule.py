"""Drift in workload files: the ``[schedule]`` table, its errors, interpolation, ``extends``."""

from __future__ import annotations

import copy
import glob
import tomllib
from pathlib import Path

import pytest

from pivotflow.errors import ConfigError
from pivotflow.sim.workload import load_workload, parse_workload

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).parents[2]
BASE = ROOT / "bench/workloads/dense7b_judge7b.toml"
DRIFT = sorted(glob.glob(str(ROOT / "bench/workloads/drift/*.toml")))


def _with(schedule: object) -> dict:
    data = tomllib.loads(BASE.read_text())
    data["schedule"] = copy.deepcopy(schedule)
    return data


def _bad(schedule: object) -> str:
    with pytest.raises(ConfigError) as info:
        parse_workload(_with(schedule), "w.toml")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("w.toml: [schedule]")
    return msg


def test_piecewise_linear_between_points_constant_outside() -> None:
    wl = parse_workload(_with({
        "response_median_tokens": [[2, 1000], [6, 4000]],
        "response_cap_tokens": [[2, 8192], [6, 16384]],
        "verdict_tokens": [[0, 256], [4, 512]],
        "response_p99_over_median": [[0, 10.0], [10, 5.0]],
    }), "w.toml")
    assert wl.response_at(0).median == 1000 and wl.response_at(2).median == 1000
    assert wl.response_at(3).median == 1750 and wl.response_at(4).cap == 12288
    assert wl.response_at(6).median == 4000 and wl.response_at(60).median == 4000
    assert wl.response_at(5).p99_over_median == pytest.approx(7.5)
    assert (wl.verdict_at(2), wl.verdict_at(9)) == (384, 512)
    late = wl.at(8)  # a regime alone: stationary, its lengths held
    assert late.schedule is None and late.response.median == 4000 and late.verdict_tokens == 512
    assert wl.max_response_cap == 16384 and wl.max_verdict_tokens == 512


def test_without_a_schedule_the_tables_hold() -> None:
    wl = load_workload(BASE)
    assert wl.schedule is None and wl.at(7) is wl and wl.response_at(7) == wl.response


@pytest.mark.parametrize(("schedule", "needle"), [
    ({"response_median": [[0, 1]]}, "unknown key 'response_median'"),
    ({"verdict_tokens": []}, "verdict_tokens must be a non-empty list"),
    ({"verdict_tokens": 256}, "verdict_tokens must be a non-empty list"),
    ({"verdict_tokens": [[0, 256, 3]]}, "point 0: expected [step, value]"),
    ({"verdict_tokens": [[-1, 256]]}, "point 0: step -1 must be an integer >= 0"),
    ({"verdict_tokens": [[1.5, 256]]}, "point 0: step 1.5 must be an integer"),
    ({"verdict_tokens": [[0, "long"]]}, "point 0: value 'long' must be a number"),
    ({"verdict_tokens": [[0, 256.5]]}, "point 0: value 256.5 must be an integer"),
    ({"verdict_tokens": [[0, 4]]}, "point 0: value 4 must be at least 5"),
    ({"response_p99_over_median": [[0, 0.5]]}, "value 0.5 must be at least 1.0"),
    ({"response_median_tokens": [[0, 100], [4, 200], [4, 300]]},
     "point 2: steps must increase (4 after 4)"),
    ({"response_median_tokens": [[0, 1000], [5, 9000]]},
     "at step 5 response_cap_tokens 8192 is below response_median_tokens 9000"),
    ({"source": 3}, "source must be a string"),
    ([1, 2], "must be a table"),
])
def test_bad_schedules_are_one_line_errors_naming_key_and_point(schedule: object,
                                                                 needle: str) -> None:
    assert needle in _bad(schedule)


def test_a_budget_drawn_response_drifts_but_not_its_prompts_per_step() -> None:
    data = _with({"response_median_tokens": [[0, 1000], [4, 2000]]})
    data["response"]["draw"] = "budget"  # the graph's budget stage draws at the group's step
    assert parse_workload(data, "w.toml").schedule is not None
    data = _with({"prompts_per_step": [[0, 512], [4, 1024]]})
    data["response"]["draw"] = "budget"
    with pytest.raises(ConfigError, match=r"w.toml: \[schedule\] prompts_per_step cannot "
                                          r"drift with \[response\] draw = \"budget\""):
        parse_workload(data, "w.toml")


def test_scaling_the_cluster_scales_a_prompts_schedule() -> None:
    wl = parse_workload(_with({"prompts_per_step": [[0, 512], [4, 1024]]}), "w.toml")
    big = wl.scaled(512)
    assert (big.at(0).prompts_per_step, big.at(4).prompts_per_step) == (2048, 4096)


def test_extends_takes_the_base_tables_and_overrides_keys(tmp_path: Path) -> None:
    f = tmp_path / "v.toml"
    f.write_text(f'extends = "{BASE}"\n[workload]\nname = "v"\nsteps = 3\n'
                 "[schedule]\nresponse_median_tokens = [[0, 1000], [2, 2000]]\n")
    wl = load_workload(f)
    assert (wl.name, wl.steps, wl.policy.name) == ("v", 3, load_workload(BASE).policy.name)
    assert wl.response_at(2).median == 2000
    loop = tmp_path / "a.toml"
    loop.write_text('extends = "a.toml"\n')
    with pytest.raises(ConfigError, match="loops back"):
        load_workload(loop)
    missing = tmp_path / "m.toml"
    missing.write_text('extends = "nowhere.toml"\n')
    with pytest.raises(ConfigError, match="nowhere.toml"):
        load_workload(missing)


def test_shipped_drift_files_grow_and_one_is_stationary() -> None:
    loaded = [load_workload(p) for p in DRIFT]
    drifting = [w for w in loaded if w.schedule is not None]
    assert len(drifting) == 4 and len(loaded) == 5
    for w in drifting:
        assert w.schedule.source  # every schedule says where it comes from
        early, late = w.at(0).response, w.at(w.steps).response
        assert late.median >= 3 * early.median and late.cap >= early.cap
        assert w.at(0).prompts_per_step == w.at(w.steps).prompts_per_step
