"""``flow.jsonl``: the controller's pools, queues and jobs in flight sampled over time.

A step's line in metrics.jsonl sees the queues only at the step's end, which hides how they fill
and drain within it; the plots (``pivotflow.metrics_plots``) draw these samples instead when a
run has them. Whoever runs the controller calls ``FlowSampler.sample()`` now and then (run.py's
watcher loop does, a few times a second); each call appends one JSON line (keys in
docs/records.md "flow.jsonl"):

* ``time_s``: seconds since the run started, on metrics.jsonl's clock, so it continues across
  resumes (a resumed run's controller restarts its clock at its checkpoint's step time).
* ``segment``: 0 for a fresh run, then 1, 2, ... for each resume that appended to the file.
* ``policy_version``, ``pools`` (workers per pool), ``queue_depth`` (samples waiting per
  edge), ``jobs_in_flight`` (jobs sent and not answered, per stage).

Sampling only reads the controller, and never fails a run: a write that fails (a full disk) is
logged once and sampling stops.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import msgspec

from pivotflow.errors import MetricsError
from pivotflow.metrics import _append_whole as append_whole
from pivotflow.metrics import parse_json_lines, read_metrics

log = logging.getLogger(__name__)

FLOW_KEYS = ("time_s", "segment", "policy_version", "pools", "queue_depth", "jobs_in_flight")

_encoder = msgspec.json.Encoder()


def _value(obj: Any, name: str) -> Any:
    """``obj.name``, called if it is a method (the controller's parts may expose their state
    either way)."""
    value = getattr(obj, name)
    return value() if callable(value) else value


def read_flow(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """flow.jsonl's lines as dicts; a torn last line (a crash mid-write) is left out.

    Raises:
        MetricsError: the file is unreadable, or a line other than the last is not a JSON
            object (the message names the file and the line).
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise MetricsError(f"cannot read flow samples {p}: {e}") from e
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
    return parse_json_lines(p, data, "flow sample")


class FlowSampler:
    """Appends the live controller's flow to ``path`` at each ``sample()``.

    ``time_offset_s``: added to the controller's own clock (seconds since ``Controller.run``
    started). None: inferred at the first sample, as run.py continues metrics.jsonl's time_s,
    from the metrics.jsonl beside ``path``: the time_s of the last step at or before the
    policy version the controller starts from (0.0 for a fresh run). ``segment``: None counts
    on from the file's last line (0 when there is none).
    """

    def __init__(self, ctl: Any, path: str | os.PathLike[str], *,
                 time_offset_s: float | None = None, segment: int | None = None) -> None:
        self.ctl = ctl
        self.path = Path(path)
        self.time_offset_s = time_offset_s
        self.samples = 0
        self._stopped = False
        self.segment = self._next_segment() if segment is None else segment

    def _next_segment(self) -> int:
        """One past the last segment in an existing file (whose torn last line is cut now,
        so this segment's first line starts a line of its own)."""
        if not self.path.is_file():
            return 0
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with open(self.path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
        try:
            lines = read_flow(self.path)
        except MetricsError as exc:
            log.warning("%s; its segments are not counted on", exc)
            return 1
        return int(lines[-1].get("segment") or 0) + 1 if lines else 0

    def _offset(self) -> float:
        if self.time_offset_s is None:
            self.time_offset_s = 0.0
            version = int(_value(self.ctl, "version"))
            metrics = self.path.with_name("metrics.jsonl")
            if version > 0 and metrics.is_file():
                try:
                    before = [r for r in read_metrics(metrics) if int(r["step"]) <= version]
                except (MetricsError, KeyError, TypeError, ValueError) as exc:
                    log.warning("flow samples start at 0 s: %s", exc)
                    before = []
                if before:
                    self.time_offset_s = float(before[-1].get("time_s") or 0.0)
        return self.time_offset_s

    def line(self) -> dict[str, Any] | None:
        """The flow now as one flow.jsonl object; None before the controller has started (its
        clock's origin is set when ``Controller.run`` starts)."""
        ctl = self.ctl
        now = ctl.clock.now()
        started = float(ctl.started_at)
        if started == 0.0 and now != 0.0:  # run() not started (a virtual clock starts at 0)
            return None
        order = ctl.order
        pools = _value(ctl, "pools")
        edges = _value(ctl, "edges")
        inflight = _value(ctl, "inflight")
        return {
            "time_s": now - started + self._offset(),
            "segment": self.segment,
            "policy_version": int(_value(ctl, "version")),
            "pools": {p.name: len(_value(p, "workers")) for p in pools.values()},
            "queue_depth": {e.name: len(e) for e in edges.values()},
            "jobs_in_flight": {order[i].name: int(n) for i, n in inflight.items()},
        }

    def sample(self) -> bool:
        """Append one line (unbuffered: a crash loses none); False when nothing was written (not
        started yet, or sampling stopped after a failed write)."""
        if self._stopped:
            return False
        try:
            line = self.line()
            if line is None:
                return False
            # whole or not at all: a full disk cuts the file back to its last whole line
            append_whole(self.path, _encoder.encode(line) + b"\n")
        except Exception as exc:  # the flow is a courtesy: it must never stop a run
            self._stopped = True
            log.warning("flow samples stopped after %d line(s) in %s: %s",
                        self.samples, self.path, exc)
            return False
        self.samples += 1
        return True

    def close(self) -> None:
        """Stop sampling (each line is already on disk: nothing is held open)."""
        self._stopped = True
