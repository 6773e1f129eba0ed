"""Run records: what every run leaves under its ``--out`` folder, and rate meters.

Files (key names are an interface; see docs/records.md):

* ``config.json``: the resolved configuration.
* ``metrics.jsonl``: one ``StepRecord`` per optimizer step, one JSON object per line.
* ``metrics.superseded.jsonl``: lines a resume took again (steps after the checkpoint it
  continued from), moved here as they were when the resumed run recorded its first step.
* ``samples.jsonl``: a few of each step's trained samples, whole (``pivotflow.sinks.samples``
  lists the keys); a resume moves the lines after its checkpoint to
  ``samples.superseded.jsonl``, as it does the metrics.
* ``eval.jsonl``: one line per evaluation round (``--set eval_every=N``;
  ``pivotflow.controller.evaluation``), keyed by the step it was taken at and continued by a
  resume as the metrics are.
* ``summary.json``: one ``RunSummary`` at the end.
* ``plots/``: PNGs drawn from ``metrics.jsonl`` (``pivotflow.metrics_plots``).

Extra keys: ``StepRecord.extra`` and ``RunSummary.extra`` are flattened into the top level of the
JSON object on write (an extra key that collides with a standard key is an error). Readers get
plain dicts back, so extra keys survive a round trip. Non-finite floats are written as ``null``.
Nothing here reads the clock: times are given by the caller, so records and meters work the same
in the real controller and in the simulator's virtual time.
"""

from __future__ import annotations

import math
import os
from collections import deque
from pathlib import Path
from typing import Any

import msgspec

from pivotflow.errors import MetricsError


class ShiftEvent(msgspec.Struct, kw_only=True):
    """One worker moved between pools at ``time_s`` (seconds since run start)."""

    time_s: float
    from_: str = msgspec.field(name="from")
    to: str


class StepRecord(msgspec.Struct, kw_only=True):
    """One line of metrics.jsonl: the state after one optimizer step.

    ``shifts``, ``migrations`` and ``tokens_generated`` are cumulative since the run started.
    ``shift_events`` lists the shifts since the previous record; it is written only when non-empty.
    ``extra`` holds further metrics (numbers, null, or any JSON value), written as top-level keys.
    """

    step: int
    time_s: float
    policy_version: int
    samples: int
    reward_mean: float | None
    task_accuracy: float | None = None
    pools: dict[str, int] = {}
    queue_depth: dict[str, int] = {}
    shifts: int = 0
    migrations: int = 0
    tokens_generated: int = 0
    shift_events: list[ShiftEvent] = []
    extra: dict[str, Any] = {}


class Ledger(msgspec.Struct, kw_only=True):
    """Exactly-once accounting: every prompt in must come out as one trained group."""

    prompts_in: int = 0
    groups_trained: int = 0
    samples_trained: int = 0
    lost: int = 0
    duplicates: int = 0


class RunSummary(msgspec.Struct, kw_only=True):
    """summary.json: totals for the whole run; ``extra`` holds any further JSON values."""

    steps: int
    wall_s: float
    samples_per_s: float
    tokens_per_s: float
    shifts: int
    migrations: int
    worker_restarts: int
    ledger: Ledger
    extra: dict[str, Any] = {}


STEP_KEYS = frozenset(f.encode_name for f in msgspec.structs.fields(StepRecord)) - {
    "shift_events",
    "extra",
}
SUMMARY_KEYS = frozenset(f.encode_name for f in msgspec.structs.fields(RunSummary)) - {"extra"}

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def _flatten(obj: msgspec.Struct, what: str) -> dict[str, Any]:
    """Struct -> dict with ``extra`` merged into the top level; a clashing key raises."""
    try:
        out: dict[str, Any] = msgspec.to_builtins(obj)
    except TypeError as e:  # e.g. a tensor where a float belongs
        raise MetricsError(f"{what}: a value cannot be written as JSON: {e}") from e
    extra = out.pop("extra", {})
    if out.get("shift_events") == []:
        # Written only when there are some; an extra "shift_events" (plain dicts) is then allowed.
        del out["shift_events"]
    clash = sorted(set(extra) & set(out))
    if clash:
        raise MetricsError(f"{what}: extra keys {clash} clash with standard record keys")
    out.update(extra)
    return out


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old or the new file, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:  # a full disk: the old file stays whole, and no half-written temp file
        tmp.unlink(missing_ok=True)
        raise


def _append_whole(path: Path, data: bytes) -> None:
    """Append ``data`` unbuffered; if the write fails (a full disk), cut the file back to its
    old end, so no half line stays behind (truncating needs no free space)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view):]
        except OSError:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def _enc_hook(obj: Any) -> Any:
    """Encode the few non-JSON types a resolved config holds (paths, sets)."""
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a metrics.jsonl file back as a list of dicts (blank lines skipped).

    Raises:
        MetricsError: the file is missing or unreadable, or a line is not a JSON object (the
            message names the file and the 1-based line number).
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise MetricsError(f"cannot read metrics file {p}: {e}") from e
    return parse_json_lines(p, data, "metrics line")


def parse_json_lines(p: Path, data: bytes, what: str) -> list[dict[str, Any]]:
    """JSONL bytes read from ``p`` as dicts (blank lines skipped); a bad line is a
    MetricsError naming the file, the 1-based line and ``what`` a line is."""
    records: list[dict[str, Any]] = []
    for lineno, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = _decoder.decode(line)
        except msgspec.DecodeError as e:
            raise MetricsError(f"{p}:{lineno}: malformed {what}: {e}") from e
        if not isinstance(obj, dict):
            raise MetricsError(f"{p}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        records.append(obj)
    return records


def read_summary(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read summary.json as a dict; raises MetricsError naming the file if it is bad."""
    p = Path(path)
    try:
        obj = _decoder.decode(p.read_bytes())
    except (OSError, msgspec.DecodeError) as e:
        raise MetricsError(f"cannot read run summary {p}: {e}") from e
    if not isinstance(obj, dict):
        raise MetricsError(f"{p}: expected a JSON object, got {type(obj).__name__}")
    return obj


class StepLog:
    """A JSONL file of objects keyed by ``step``, appended a step at a time and continued by a
    resume: metrics.jsonl (one line a step) and samples.jsonl (a few). A torn last line (a
    crash mid-write) is cut off when it is opened; ``continue_after`` moves the lines after a
    checkpoint's step to NAME.superseded.jsonl at the next append, not before.

    Raises:
        MetricsError: the existing file has a malformed line other than a torn last one.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.superseded_path = path.with_name(f"{path.stem}.superseded.jsonl")
        self.last_step: int | None = None
        self._cut_at: int | None = None  # continue_after: applied at the next append
        if self.path.exists():
            self._repair_torn_tail()
            records = read_metrics(self.path)
            if records:
                self.last_step = int(records[-1]["step"])

    def _repair_torn_tail(self) -> None:
        """Drop bytes after the last newline: only a crash mid-append leaves them there."""
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            with open(self.path, "r+b") as f:
                f.truncate(cut)

    def append(self, step: int, lines: list[dict[str, Any]]) -> None:
        """Append a step's lines (written whole or not at all).

        Raises:
            MetricsError: ``step`` is not above the last recorded step (a resumed run must
                call ``continue_after`` or ``truncate_after`` first).
        """
        if self._cut_at is not None:
            self._supersede_after(self._cut_at)
        if self.last_step is not None and step <= self.last_step:
            raise MetricsError(
                f"{self.path}: step {step} is not after the last recorded step "
                f"{self.last_step} (call truncate_after(step) when resuming from a checkpoint)"
            )
        _append_whole(self.path, b"".join(_encoder.encode(line) + b"\n" for line in lines))
        self.last_step = step

    def continue_after(self, step: int) -> None:
        """Resume after ``step``: the next ``append`` first moves the lines after it to the
        superseded file. Until then the file is not touched, so a resume that fails before
        its first step leaves the run's records byte for byte as they were."""
        self._cut_at = step
        self.last_step = step if self.last_step is None else min(self.last_step, step)

    def _supersede_after(self, step: int) -> None:
        records = read_metrics(self.path) if self.path.exists() else []
        later = [r for r in records if int(r["step"]) > step]
        if later:  # appended first: a crash between the two writes keeps both copies
            with open(self.superseded_path, "ab") as f:
                f.write(b"".join(_encoder.encode(r) + b"\n" for r in later))
                f.flush()
                os.fsync(f.fileno())
            self.truncate_after(step)
        self._cut_at = None

    def truncate_after(self, step: int) -> int:
        """Drop the lines with ``step`` > the given step (resuming from that checkpoint).

        Returns how many lines were dropped. The file is rewritten atomically.
        """
        if not self.path.exists():
            return 0
        records = read_metrics(self.path)
        kept = [r for r in records if int(r["step"]) <= step]
        if len(kept) != len(records):
            _atomic_write(self.path, b"".join(_encoder.encode(r) + b"\n" for r in kept))
        self.last_step = int(kept[-1]["step"]) if kept else None
        return len(records) - len(kept)


class RunRecorder:
    """Writes one run's records under ``out_dir`` (created if missing).

    An existing metrics.jsonl is continued, not replaced, so a resumed run keeps one history. A
    torn last line (a crash mid-write) is cut off when the recorder opens the file.

    Raises:
        MetricsError: the existing metrics.jsonl has a malformed line other than a torn last one.
    """

    def __init__(self, out_dir: str | os.PathLike[str]) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self.samples_path = self.out_dir / "samples.jsonl"
        self.summary_path = self.out_dir / "summary.json"
        self.config_path = self.out_dir / "config.json"
        self.plots_dir = self.out_dir / "plots"
        self.metrics = StepLog(self.metrics_path)
        self.samples = StepLog(self.samples_path)
        self.evals = StepLog(self.out_dir / "eval.jsonl")

    @property
    def last_step(self) -> int | None:
        return self.metrics.last_step

    def write_config(self, config: Any) -> Path:
        """Write the resolved config (a dict or msgspec Struct) to config.json, atomically.

        Raises:
            MetricsError: the config holds a value that cannot be written as JSON.
        """
        try:
            data = msgspec.json.encode(config, enc_hook=_enc_hook)
        except (TypeError, NotImplementedError) as e:
            raise MetricsError(f"config for {self.config_path} is not JSON-encodable: {e}") from e
        _atomic_write(self.config_path, msgspec.json.format(data, indent=2) + b"\n")
        return self.config_path

    def record_step(self, record: StepRecord) -> None:
        """Append one line to metrics.jsonl and flush it.

        Raises:
            MetricsError: ``record.step`` is not above the last recorded step (a resumed run must
                call ``truncate_after`` first), or an extra key clashes with a standard key.
        """
        self.metrics.append(record.step, [_flatten(record, f"step {record.step}")])

    def record_samples(self, step: int, lines: list[dict[str, Any]]) -> None:
        """Append a step's samples.jsonl lines (none: nothing written, no file made)."""
        if lines:
            self.samples.append(step, lines)

    def record_eval(self, record: dict[str, Any]) -> None:
        """Append an evaluation round's line to eval.jsonl (keyed by its ``step``)."""
        self.evals.append(int(record["step"]), [record])

    def continue_after(self, step: int) -> None:
        """Resume after ``step``: the next ``record_step`` first moves the records after it to
        metrics.superseded.jsonl (and the next ``record_samples`` and ``record_eval``, the
        samples and rounds after it to their superseded files). Until then no file is touched,
        so a resume that fails before its first step leaves the run's records byte for byte as
        they were."""
        self.metrics.continue_after(step)
        self.samples.continue_after(step)
        self.evals.continue_after(step)

    def truncate_after(self, step: int) -> int:
        """Drop the records with ``step`` > the given step (resuming from that checkpoint).

        Returns how many records were dropped. The file is rewritten atomically.
        """
        self.samples.truncate_after(step)
        self.evals.truncate_after(step)
        return self.metrics.truncate_after(step)

    def write_summary(self, summary: RunSummary) -> Path:
        """Write summary.json atomically (temp file + rename).

        Raises:
            MetricsError: an extra key clashes with a standard key.
        """
        data = _encoder.encode(_flatten(summary, "summary"))
        _atomic_write(self.summary_path, msgspec.json.format(data, indent=2) + b"\n")
        return self.summary_path

    def make_plots(self) -> list[Path]:
        """Draw the PNGs under ``plots/`` from metrics.jsonl; never raises (see metrics_plots)."""
        from pivotflow.metrics_plots import make_plots

        return make_plots(self.metrics_path, self.plots_dir)


class Rate:
    """Events per second over a sliding window, on timestamps the caller gives.

    ``rate(now)`` = events observed in ``(now - window_s, now]`` / ``window_s``; before a full
    window has passed since ``start`` (default: the first observation's time), it divides by the
    time elapsed instead, so a young meter is not biased low. Pass ``start`` for an exact rate:
    an inferred start counts the first event without the interval that led up to it.

    Raises:
        MetricsError: ``window_s`` <= 0, ``n`` < 0, or time goes backwards.
    """

    def __init__(self, window_s: float, start: float | None = None) -> None:
        if not window_s > 0:
            raise MetricsError(f"Rate: window_s must be > 0, got {window_s}")
        self.window_s = float(window_s)
        self._start = start
        self._last = -math.inf
        self._events: deque[list[Any]] = deque()  # [bucket start, count], mutable
        self._count = 0
        # Events closer than this share one entry, so memory stays ~RATE_BUCKETS entries
        # whatever the event rate (an event may leave the window up to one bucket early).
        self._bucket_s = self.window_s / RATE_BUCKETS

    def _advance(self, now: float) -> None:
        if now < self._last:
            raise MetricsError(f"Rate: time went backwards ({now} < {self._last})")
        self._last = now
        if self._start is None:
            self._start = now
        horizon = now - self.window_s
        events = self._events
        while events and events[0][0] <= horizon:
            self._count -= events.popleft()[1]

    def observe(self, now: float, n: int = 1) -> None:
        """Count ``n`` events at time ``now``."""
        events = self._events
        # The hot path (every sample passes two edges, four calls): an event in the newest
        # bucket only adds to it; events that left the window go at the next bucket or rate().
        if events and n >= 0 and self._last <= now < events[-1][0] + self._bucket_s:
            self._last = now
            events[-1][1] += n
            self._count += n
            return
        if n < 0:
            raise MetricsError(f"Rate: event count must be >= 0, got {n}")
        self._advance(now)
        events.append([now, n])
        self._count += n

    def rate(self, now: float) -> float:
        """Events per second at ``now``; 0.0 when no time has elapsed since the start."""
        self._advance(now)
        start = now if self._start is None else self._start
        span = min(self.window_s, now - start)
        return self._count / span if span > 0 else 0.0


RATE_BUCKETS = 256


class EwmaRate:
    """Exponentially weighted events per second, time constant ``tau_s``, on given timestamps.

    Each event's weight decays as ``exp(-age / tau_s)``; for a steady rate ``lam`` the decayed
    count tends to ``lam * tau_s``. The estimate divides by ``tau_s * (1 - exp(-elapsed / tau_s))``
    so it is unbiased from the first second on (the same start-up correction as Adam's).

    Raises:
        MetricsError: ``tau_s`` <= 0, ``n`` < 0, or time goes backwards.
    """

    def __init__(self, tau_s: float, start: float | None = None) -> None:
        if not tau_s > 0:
            raise MetricsError(f"EwmaRate: tau_s must be > 0, got {tau_s}")
        self.tau_s = float(tau_s)
        self._start = start
        self._last: float | None = start
        self._mass = 0.0

    def _advance(self, now: float) -> None:
        if self._last is not None:
            if now < self._last:
                raise MetricsError(f"EwmaRate: time went backwards ({now} < {self._last})")
            self._mass *= math.exp(-(now - self._last) / self.tau_s)
        if self._start is None:
            self._start = now
        self._last = now

    def observe(self, now: float, n: int = 1) -> None:
        """Count ``n`` events at time ``now``."""
        if n < 0:
            raise MetricsError(f"EwmaRate: event count must be >= 0, got {n}")
        self._advance(now)
        self._mass += n

    def rate(self, now: float) -> float:
        """Events per second at ``now``; 0.0 when no time has elapsed since the start."""
        self._advance(now)
        elapsed = now - (now if self._start is None else self._start)
        if elapsed <= 0:
            return 0.0
        return self._mass / (self.tau_s * -math.expm1(-elapsed / self.tau_s))
