"""The data a run's plots are drawn over time from (split from metrics_plots.py, which draws
them): step records' times on one clock across resumes, where each resume continued (from
config.json's history), each step's shifts placed in time, workers per pool as step functions
of time, and flow.jsonl's samples on one time axis. No matplotlib here."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

Timeline = dict[str, tuple[list[float], list[float]]]


def float_or_nan(v: Any) -> float:
    """A record value as a float for plotting; null and non-numbers become NaN (a gap)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def continuous_times(records: list[dict[str, Any]]) -> list[float]:
    """time_s of each record on one clock: where it goes backwards (a resume of a run from
    before time_s continued restarted it from 0), the time of the step it resumed from (the
    record before) is added from there on."""
    out: list[float] = []
    offset = last = 0.0
    for r in records:
        t = float_or_nan(r.get("time_s"))
        if out and not math.isnan(t) and t + offset < last:
            offset = last
        out.append(t + offset)
        if not math.isnan(t + offset):
            last = t + offset
    return out


def read_history(config_path: Path) -> list[dict[str, Any]]:
    """config.json's ``history`` (the run's segments), [] when there is none to read."""
    try:
        history = json.loads(config_path.read_text()).get("history")
    except (OSError, ValueError, AttributeError):
        return []
    return [h for h in history if isinstance(h, dict)] if isinstance(history, list) else []


def resume_points(records: list[dict[str, Any]], times: list[float],
                  history: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, time_s) where each resume continued, from config.json's history."""
    at = {int(float_or_nan(r.get("step"))): t for r, t in zip(records, times, strict=True)
          if not math.isnan(float_or_nan(r.get("step")))}
    out = []
    for h in history[1:]:
        step = h.get("from_step")
        if isinstance(step, int) and step in at:
            out.append((step, at[step]))
    return out


def _segment_start(step: float, resumes: list[tuple[int, float]]) -> float | None:
    """The run time at which the segment that recorded ``step`` started (None: the first)."""
    starts = [t for s, t in resumes if s < step]
    return starts[-1] if starts else None


def placed_shifts(records: list[dict[str, Any]], times: list[float],
                  resumes: list[tuple[int, float]]) -> list[list[tuple[float, str, str]]]:
    """Each record's shifts as (time, from, to), in time order, placed within its step: a
    shift timed before its step (a resumed segment that timed its shifts from its own start)
    is moved by the segment's start time; one still outside the step is put at its nearer end."""
    out = []
    before = 0.0
    for r, end in zip(records, times, strict=True):
        start = _segment_start(float_or_nan(r.get("step")), resumes)
        placed = []
        for e in r.get("shift_events") or []:
            if not isinstance(e, dict) or math.isnan(end):
                continue
            t = float_or_nan(e.get("time_s"))
            if not math.isnan(t) and t < before and start is not None and before <= t + start:
                t += start
            placed.append((end if math.isnan(t) else min(max(t, before), end),
                           str(e.get("from")), str(e.get("to"))))
        out.append(sorted(placed))
        if not math.isnan(end):
            before = end
    return out


def pool_timeline(records: list[dict[str, Any]],
                  resumes: list[tuple[int, float]] | None = None) -> Timeline:
    """Workers per pool as step functions of time, from each step's pools and its shifts.

    A step's record sees the pools only at its end, which would hide every shift within the
    step: each step's line starts from its end's pools with its shifts undone, then replays
    them at their times (``placed_shifts``). A jump between one step's end and the next one's
    start (a resume starts from the configured pools) is drawn where the step starts; a pool
    first seen later had 0 workers before."""
    times = continuous_times(records)
    line: Timeline = {}

    def move(name: str, t: float, value: float) -> None:
        ts, vs = line.setdefault(name, ([0.0], [0.0]))
        if vs[-1] == value:
            return
        if ts[-1] == t:  # two changes at one time: one step
            vs[-1] = value
        else:
            ts.append(t)
            vs.append(value)

    before = 0.0
    for r, end, events in zip(records, times, placed_shifts(records, times, resumes or []),
                              strict=True):
        if math.isnan(end):
            continue
        sizes = {k: float_or_nan(v) for k, v in (r.get("pools") or {}).items()}
        for _, src, dst in events:  # undo this step's shifts: the pools at its start
            sizes[src] = sizes.get(src, 0.0) + 1
            sizes[dst] = sizes.get(dst, 0.0) - 1
        for name in [*line, *(n for n in sizes if n not in line)]:
            move(name, before, sizes.get(name, 0.0))
        for t, src, dst in events:
            for name, delta in ((src, -1.0), (dst, 1.0)):
                move(name, t, line.get(name, ([0.0], [0.0]))[1][-1] + delta)
        before = end
    for ts, vs in line.values():
        ts.append(before)
        vs.append(vs[-1])
    return line


def flow_timeline(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """flow.jsonl's samples on one time axis, in time order: a segment's samples from after
    the next segment's start (the time a resume took again from its checkpoint) are left out."""
    timed = [(int(float_or_nan(s.get("segment")) if s.get("segment") is not None else 0),
              float_or_nan(s.get("time_s")), s) for s in samples]
    starts: dict[int, float] = {}
    for seg, t, _ in timed:
        if not math.isnan(t):
            starts.setdefault(seg, t)
    kept = [(t, s) for seg, t, s in timed if not math.isnan(t)
            and t < min([u for k, u in starts.items() if k > seg], default=math.inf)]
    return [s for _, s in sorted(kept, key=lambda ts: ts[0])]
