"""Reasoning-length responses for the tiny tasks: a per-sample length budget.

Reasoning RL's response lengths are log-normal with a long tail (p99 about 10x the median).
``length_budget`` makes a map stage that draws each sample's length from that distribution,
seeded by the sample id (so every planner, and the simulator, sees the same lengths), and
forces the rollout to generate exactly that many tokens (``min_tokens = max_tokens``).

Drift (issue 24): given a ``Schedule`` (pivotflow/sim/schedule.py, the workload files'
``[schedule]``), the median, p99/median and cap follow it over steps. A sample's step is its
group's place in the source's order (``group_id // groups_per_step``), not the version it
happens to be generated at: so the lengths stay a function of the sample alone, the same under
every planner, staleness and timing (the real run and the simulator draw the very same ones).
"""

from __future__ import annotations

import math
import random
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pivotflow.errors import ConfigError

if TYPE_CHECKING:  # (pivotflow.sim's package imports the simulator, which imports this module)
    from pivotflow.sim.schedule import Schedule

Z99 = 2.3263  # the standard normal's 99th percentile
# the schedule keys a length budget follows (the judge's verdict length is the judge's own, and
# the controller's groups_per_step is fixed for a run)
BUDGET_KEYS = ("response_median_tokens", "response_p99_over_median", "response_cap_tokens")


def budget_length(sample_id: int, median: float, p99_ratio: float, cap: int) -> int:
    """Sample ``sample_id``'s response length: log-normal(median, sigma), at least 1, capped."""
    sigma = math.log(p99_ratio) / Z99
    n = random.Random(sample_id).lognormvariate(math.log(median), sigma)
    return max(1, min(cap, round(n)))


def length_budget(median: float, p99_ratio: float, cap: int, schedule: Schedule | None = None,
                  groups_per_step: int = 1) -> Callable[..., dict[str, int]]:
    """A map stage writing ``min_tokens`` and ``max_tokens`` for each sample; with a
    ``schedule``, the three figures are those of the sample's step (the arguments where the
    schedule has no curve)."""

    def budget(sample_id: int, group_id: int = 0, **_: object) -> dict[str, int]:
        """This sample's response length: log-normal(median, sigma), at least 1, capped."""
        if schedule is None:
            n = budget_length(sample_id, median, p99_ratio, cap)
        else:
            step = group_id // groups_per_step
            n = budget_length(sample_id,
                              schedule.at("response_median_tokens", step, median),
                              schedule.at("response_p99_over_median", step, p99_ratio),
                              int(schedule.at("response_cap_tokens", step, cap)))
        return {"min_tokens": n, "max_tokens": n}

    return budget


def load_length_schedule(path: str | Path) -> Schedule:
    """The ``[schedule]`` table of a TOML file (a workload file, such as
    bench/workloads/cpu_tiny_longtail_drift.toml, or one holding only that table), for a real
    graph's budget stage; a one-line ConfigError naming the file for a missing file, a missing
    table, or a key a budget cannot follow."""
    from pivotflow.sim.schedule import parse_schedule

    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except OSError as exc:
        raise ConfigError(f"length schedule {p}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"length schedule {p}: not valid TOML ({exc})") from exc
    sched = parse_schedule(data.get("schedule"), str(p))
    if sched is None:
        raise ConfigError(f"length schedule {p}: no [schedule] table")
    other = sorted(set(sched.curves) - set(BUDGET_KEYS))
    if other:
        raise ConfigError(f"length schedule {p}: [schedule] {other[0]} cannot drift in a real "
                          f"run's length budget; it follows only {', '.join(BUDGET_KEYS)}")
    return sched
