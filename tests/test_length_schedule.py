"""A real graph's length budget following a drift schedule (issue 24 part 2): the lengths of
graphs/grpo_genrm_longtail.py's budget stage at a sample's step, the schedule file's errors,
and the graph built for the run's longest cap."""

from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path

import pytest

from pivotflow.errors import ConfigError
from pivotflow.sim.workload import load_workload
from pivotflow.tasks.length_budget import budget_length, length_budget, load_length_schedule

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).parents[1]
DRIFT = ROOT / "bench/workloads/cpu_tiny_longtail_drift.toml"


def test_without_a_schedule_the_budget_is_the_stationary_draw() -> None:
    budget = length_budget(24, 10.0, 280)
    for sid in range(50):
        n = budget_length(sid, 24, 10.0, 280)
        assert budget(sample_id=sid, group_id=sid // 8) == {"min_tokens": n, "max_tokens": n}


def test_a_schedule_moves_each_samples_length_at_its_groups_step() -> None:
    sched = load_length_schedule(DRIFT)
    budget = length_budget(24, 10.0, 280, sched, groups_per_step=8)
    group_size, per_step = 8, 8

    def lengths(step: int) -> list[int]:
        out = []
        for g in range(step * per_step, (step + 1) * per_step):
            for k in range(group_size):
                sid = g * group_size + k
                out.append(budget(sample_id=sid, group_id=g)["max_tokens"])
        return out

    # the file: median 24 until step 4, a ramp to 96 at step 8; cap 280 -> 560
    for step, median, cap in ((0, 24, 280), (6, 60, 420), (10, 96, 560)):
        got = lengths(step)
        sids = [g * group_size + k for g in range(step * per_step, (step + 1) * per_step)
                for k in range(group_size)]
        assert got == [budget_length(s, median, 10.0, cap) for s in sids]
        assert max(got) <= cap
    assert statistics.median(lengths(10)) > 2.5 * statistics.median(lengths(0))


@pytest.mark.parametrize(("text", "why"), [
    (None, "No such file"),
    ("[schedule\n", "not valid TOML"),
    ("[workload]\nname = 'x'\n", "no [schedule] table"),
    ("[schedule]\nverdict_tokens = [[0, 7], [4, 9]]\n",
     "verdict_tokens cannot drift in a real run's length budget"),
])
def test_a_bad_schedule_file_is_one_line_naming_it(tmp_path: Path, text: str | None,
                                                   why: str) -> None:
    path = tmp_path / "sched.toml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match="length schedule .*sched.toml") as err:
        load_length_schedule(path)
    assert why in str(err.value) and "\n" not in str(err.value)


def test_the_graph_serves_the_runs_longest_cap_and_the_simulator_loads_the_file() -> None:
    spec = importlib.util.spec_from_file_location("longtail", ROOT / "graphs/grpo_genrm_longtail.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    g = mod.build({**mod.DEFAULTS, "schedule": str(DRIFT)})
    rollout = next(n for n in g.order() if n.name == "rollout")
    assert rollout.options["max_tokens"] == 560
    assert g.models["policy"].context >= 560 + mod.PROMPT_ROOM
    wl = load_workload(DRIFT)  # draw = "budget" with a [schedule]: the simulator takes it
    assert wl.schedule is not None and wl.max_response_cap == 560
