"""One default per knob: the run's configuration and the parts it configures agree, and the
backpressure planner's knobs reach it from ``--set planner.KEY=`` the way ``pivotflow run``
builds it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec
import pytest

from pivotflow.config import RunConfig, parse_overrides, resolve
from pivotflow.controller.core import ControllerConfig
from pivotflow.errors import ConfigError
from pivotflow.graph_check import load_graph
from pivotflow.planner import AdaptivePlanner, BackpressurePlanner
from pivotflow.planner.backpressure import BackpressureConfig
from pivotflow.run import build_planner, pool_order

pytestmark = pytest.mark.timeout(60)
GRAPH = Path(__file__).resolve().parents[1] / "graphs" / "grpo_rule.py"


def test_controller_and_run_configs_share_their_defaults() -> None:
    run = RunConfig()
    shared = [f for f in dataclasses.fields(ControllerConfig) if f.name in RunConfig.__struct_fields__]
    # the fields run.py copies from one into the other (steps, worker_timeout_s, ...)
    assert {f.name for f in shared} >= {"steps", "worker_timeout_s", "heartbeat_s",
                                       "max_staleness", "max_jobs_per_frame"}
    assert {f.name: f.default for f in shared} == {f.name: getattr(run, f.name) for f in shared}


def test_planner_knob_defaults_are_the_planners() -> None:
    planner, knobs = BackpressurePlanner(), RunConfig().planner_knobs
    assert msgspec.structs.asdict(knobs) == {k: getattr(planner, k)
                                             for k in BackpressureConfig.__struct_fields__}


@pytest.mark.parametrize("name", ["backpressure", "adaptive"])
def test_set_planner_knob_reaches_the_planner(name: str) -> None:
    graph = load_graph(GRAPH)
    cfg = resolve(parse_overrides([f"planner={name}", "planner.interval_s=0.25",
                                   "planner.hysteresis=2", "planner.cooldown_costs=3.5",
                                   "planner.share_costs=0"]), {}, pool_order(graph))
    planner = build_planner(cfg, graph)
    assert isinstance(planner, AdaptivePlanner if name == "adaptive" else BackpressurePlanner)
    assert (planner.interval_s, planner.hysteresis, planner.cooldown_costs,
            planner.share_costs) == (0.25, 2.0, 3.5, 0.0)


@pytest.mark.parametrize(
    ("items", "match"),
    [
        (["planner.interval_s=fast"], r"--set planner.interval_s='fast': expected float"),
        (["planner.interval_s=0"], r"--set planner.interval_s=0.0: must be > 0"),
        (["planner.hysteresis=-1"], r"--set planner.hysteresis=-1.0: must be >= 0"),
        (["planner.horizon=3"], r"--set planner.horizon=3: unknown key; valid keys: .*"
                                r"planner.cooldown_costs, planner.hysteresis, planner.interval_s"),
        (["planner=static", "planner.cooldown_costs=2"],
         r"--set planner.cooldown_costs: only the backpressure and adaptive planners"),
    ],
)
def test_bad_planner_knob_is_a_one_line_error(items: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        resolve(parse_overrides(items), {})
    assert "\n" not in str(info.value)
