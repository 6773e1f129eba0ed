from __future__ import annotations

import pytest
from sim_workloads import FAST_SHIFTS, tiny

from pivotflow.sim.workload import Workload


@pytest.fixture
def tiny_workload() -> Workload:
    return tiny()


@pytest.fixture
def fast_shift_workload() -> Workload:
    """``tiny_workload`` with shifts that pay on its steps of a few seconds."""
    return tiny(FAST_SHIFTS)
