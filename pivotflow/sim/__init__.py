"""The cluster simulator: the real controller, pools and planners in virtual time, with
simulated workers whose costs come from a workload file (see bench/workloads/README.md).

    from pivotflow.sim import Split, load_workload, simulate
    result = simulate(load_workload("bench/workloads/dense7b_judge7b.toml"), "backpressure",
                      Split(45, 27, 56))
"""

from __future__ import annotations

from pivotflow.sim.cluster import SimResult, Split, simulate
from pivotflow.sim.fluid import fluid_bound, rank_splits, role_rates
from pivotflow.sim.workload import Workload, load_workload, parse_workload

__all__ = [
    "SimResult",
    "Split",
    "Workload",
    "fluid_bound",
    "load_workload",
    "parse_workload",
    "rank_splits",
    "role_rates",
    "simulate",
]
