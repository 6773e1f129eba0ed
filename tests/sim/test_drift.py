"""A drifting workload in the simulator: lengths follow the schedule, batches follow the
lengths, and the adaptive planner re-sizes its standing split toward the new regime."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sim_workloads import FAST_SHIFTS, tiny

from pivotflow.errors import ConfigError
from pivotflow.sim.cluster import Split, role_options, simulate
from pivotflow.sim.cost_model import CostModel
from pivotflow.sim.fluid import fluid_bound, rank_splits
from pivotflow.sim.schedule import parse_schedule
from pivotflow.sim.workload import Workload

pytestmark = pytest.mark.timeout(120)

GROWING = {  # responses 4x longer from step 5 on (the early regime: steps 0-2)
    "response_median_tokens": [[0, 100], [2, 100], [5, 400]],
    "response_cap_tokens": [[0, 1000], [2, 1000], [5, 3000]],
}


def drifting() -> Workload:
    return replace(tiny(FAST_SHIFTS, steps=10), schedule=parse_schedule(GROWING, "tiny.toml"))


def test_lengths_and_batches_follow_the_schedule() -> None:
    wl = drifting()
    r = simulate(wl, "static", Split(2, 2, 4))
    lens = [rec["response_len_mean"] for rec in r.records]
    # the late steps' responses are ~4x longer (means of 32 samples a step: noisy)
    assert sum(lens[:3]) * 2.5 < sum(lens[-3:])
    early, late = (role_options(w, CostModel(w))["rollout"]["max_batch"]
                   for w in (wl.at(0), wl.at(9)))
    assert late <= early
    late_bound, early_bound = fluid_bound(wl.at(9)), fluid_bound(wl.at(0))
    whole = fluid_bound(wl)["samples_per_s"]
    assert late_bound["samples_per_s"] < whole < early_bound["samples_per_s"]


def test_adaptive_grows_the_rollout_pool_as_responses_grow() -> None:
    wl = drifting()
    start = rank_splits(wl.at(0), top=1)[0][1]  # tuned on the early regime
    r = simulate(wl, "adaptive", Split(**start))
    resizes = [d for d in r.decision_log if d.get("resize")]
    assert resizes, "no re-size in a run whose responses grew 4x"
    for d in resizes:  # every re-size move carries its numbers
        for key in ("mu_rollout", "mu_genrm", "mu_trainer", "rate_now", "rate_after",
                    "gain_s", "cost_s", "size_rollout", "target_rollout"):
            assert isinstance(d[key], float)
        assert d["rate_after"] > d["rate_now"] and d["gain_s"] > d["cost_s"]
    late = [d for d in resizes if d["version"] >= 5]
    assert late and all(d["target_rollout"] >= start["rollout"] for d in late)
    assert max(d["target_rollout"] - d["size_rollout"] for d in resizes) > 0
    t_late = r.records[5]["time_s"]
    rollout_late = [p["rollout"] for t, p in r.pool_trace if t > t_late]
    assert max(rollout_late) > start["rollout"]


def test_a_varying_batch_schedule_is_refused_by_the_simulator() -> None:
    wl = replace(tiny(), schedule=parse_schedule({"prompts_per_step": [[0, 8], [3, 16]]},
                                                 "tiny.toml"))
    with pytest.raises(ConfigError, match=r"tiny.toml: \[schedule\] prompts_per_step varies"):
        simulate(wl, "static", Split(2, 2, 4))
