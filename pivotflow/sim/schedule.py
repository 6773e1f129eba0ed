"""Drift: how a workload's lengths and batch change over a run (``[schedule]`` of a workload).

Reasoning RL's responses grow as the policy trains (DAPO, DeepSeek-R1 and ProRL report
severalfold growth of the mean length), the GenRM reads longer responses and may write longer
verdicts. A schedule gives each drifting quantity as piecewise-linear points over the policy
version (optimizer steps done), ``[[step, value], ...]``: linear between points, constant before
the first and after the last. Pure data and arithmetic (no simulator, no torch), so the real
graphs (``graphs/grpo_genrm_longtail.py``) and ``bench/elastic.py`` can read the same
schedule as the simulator.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

from pivotflow.errors import ConfigError

# key -> (integer?, smallest value): every key a ``[schedule]`` table may hold
SCHEDULE_KEYS: dict[str, tuple[bool, float]] = {
    "response_median_tokens": (True, 1),
    "response_p99_over_median": (False, 1.0),
    "response_cap_tokens": (True, 1),
    "verdict_tokens": (True, 5),
    "prompts_per_step": (True, 1),
}


@dataclass(frozen=True, slots=True)
class Curve:
    """Piecewise-linear points ``(step, value)``, steps strictly increasing."""

    points: tuple[tuple[int, float], ...]
    integer: bool = False

    def at(self, step: float) -> float:
        """The value at ``step`` (rounded for an integer quantity)."""
        pts = self.points
        steps = [s for s, _ in pts]
        i = bisect.bisect_right(steps, step)
        if i == 0:
            v = pts[0][1]
        elif i == len(pts):
            v = pts[-1][1]
        else:
            (s0, v0), (s1, v1) = pts[i - 1], pts[i]
            v = v0 + (step - s0) / (s1 - s0) * (v1 - v0)
        return float(round(v)) if self.integer else v

    def scaled(self, factor: float) -> Curve:
        return Curve(tuple((s, max(1, round(v * factor))) for s, v in self.points), self.integer)

    @property
    def steps(self) -> tuple[int, ...]:
        return tuple(s for s, _ in self.points)


@dataclass(frozen=True, slots=True)
class Schedule:
    """The drifting quantities of one workload (a key absent: held at its table's value)."""

    curves: dict[str, Curve]
    source: str = ""  # where the curve comes from (a paper, or the assumption made)

    def at(self, key: str, step: float, default: float) -> float:
        c = self.curves.get(key)
        return default if c is None else c.at(step)

    def breakpoints(self) -> list[int]:
        """Every step at which some curve bends (where the regime may change)."""
        return sorted({s for c in self.curves.values() for s in c.steps})

    def max(self, key: str, default: float) -> float:
        c = self.curves.get(key)
        return default if c is None else max(v for _, v in c.points)

    def varies(self, key: str) -> bool:
        c = self.curves.get(key)
        return c is not None and len({v for _, v in c.points}) > 1


def parse_schedule(data: Any, path: str) -> Schedule | None:
    """A validated ``Schedule`` from a ``[schedule]`` table (None when absent); raises
    ConfigError naming the file, the key and the point for every mistake."""
    if data is None:
        return None
    where = f"{path}: [schedule]"
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a table")
    curves: dict[str, Curve] = {}
    source = data.get("source", "")
    if not isinstance(source, str):
        raise ConfigError(f"{where} source must be a string, not {type(source).__name__}")
    for key, raw in data.items():
        if key == "source":
            continue
        if key not in SCHEDULE_KEYS:
            raise ConfigError(
                f"{where} unknown key {key!r}; valid: {', '.join(['source', *SCHEDULE_KEYS])}"
            )
        curves[key] = _curve(raw, f"{where} {key}", *SCHEDULE_KEYS[key])
    return Schedule(curves, source)


def _curve(raw: Any, where: str, integer: bool, lo: float) -> Curve:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where} must be a non-empty list of [step, value] points")
    points: list[tuple[int, float]] = []
    for i, p in enumerate(raw):
        if not (isinstance(p, list) and len(p) == 2):
            raise ConfigError(f"{where} point {i}: expected [step, value], got {_short(p)}")
        step, value = p
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError(f"{where} point {i}: step {_short(step)} must be an integer >= 0")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where} point {i}: value {_short(value)} must be a number")
        if integer and not float(value).is_integer():
            raise ConfigError(f"{where} point {i}: value {value} must be an integer")
        if not math.isfinite(value) or value < lo:
            raise ConfigError(f"{where} point {i}: value {value} must be at least {lo}")
        if points and step <= points[-1][0]:
            raise ConfigError(
                f"{where} point {i}: steps must increase ({step} after {points[-1][0]})"
            )
        points.append((step, float(value)))
    return Curve(tuple(points), integer)


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."
