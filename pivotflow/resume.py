"""What ``pivotflow run --resume`` carries over from the run it continues, and what it refuses.

A resume takes the earlier run's settings (its ``config.json``) and applies the ``--set`` and
``--steps`` given now on top, so ``--resume DIR`` alone continues the run as it was and
``--resume DIR --steps N`` extends it. A difference in what shapes the checkpoint's state
(SHAPE_KEYS, every ``graph.*`` knob, the graph file's content, its models and its data) is
refused with every difference listed, unless the caller accepts them knowingly; each run
segment, and what it changed or accepted, is a ``history`` entry in ``config.json``.
``resume_point`` finds the run folder and its newest whole checkpoint. Importing this module
loads no torch.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from pivotflow import checkpoints
from pivotflow.config import RunConfig
from pivotflow.controller.records import PATH_KEYS
from pivotflow.errors import CheckpointError, ConfigError
from pivotflow.graph import Graph
from pivotflow.metrics import read_metrics
from pivotflow.params.hf_folder import read_json
from pivotflow.planner.backpressure import BackpressureConfig

# Top-level settings a checkpoint's state depends on: the seed draws the prompts and the
# sampling noise (a cursor into another stream is another run), max_staleness admitted the
# groups in flight, dtype is what the weights and the optimizer's moments were trained in.
# Every graph.* knob counts too (group size, groups per step, lr, max tokens: they define the
# graph), as do the graph file's content, its models and its data.
SHAPE_KEYS = ("seed", "models_seed", "max_staleness", "dtype")
# a dict setting's --set prefix, where it is not its name
PREFIX = {"engines": "engine", "tensor_parallels": "tensor_parallel", "planner_knobs": "planner"}
POOL_KEYED = ("pools", "engines", "tensor_parallels")  # dict settings keyed by pool name
RUN_NAME = re.compile(r"-\d{8}-\d{6}$")  # run() names a fresh --out GRAPH-YYYYMMDD-HHMMSS


def fingerprint(graph_path: str | Path, graph: Graph) -> dict[str, Any]:
    """config.json's record of what the run is: graph file (and its SHA-256), models, data."""
    src = graph.order()[0].options
    # which prompts, in what order (the group sizes are the graph's: its knobs and file)
    data = {k: v for k, v in src.items() if k not in ("table", "group_size", "groups_per_step")}
    if src.get("table") is not None:  # a prompt file: its content, not only its name
        data["path"] = str(src["table"].path)
        data["sha256"] = _sha256(Path(src["table"].path))
    return {"graph_file": str(Path(graph_path).resolve()),
            "graph_sha256": _sha256(Path(graph_path)),
            "models": {m.name: m.source for m in graph.models.values()}, "data": data}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def inherited(prev: dict[str, Any], given: dict[str, Any], graph_defaults: dict[str, Any],
              pools: list[str]) -> dict[str, Any]:
    """The earlier run's settings as ``--set`` overrides, under the ones given now. A knob the
    graph file no longer has, or a pool it no longer has, is left out (the comparison then
    lists it as a difference)."""
    base: dict[str, Any] = {}
    for name in RunConfig.__struct_fields__:
        value = prev.get(name)
        if not isinstance(value, dict):  # a scalar setting (None: not recorded then)
            if name in prev:
                base[name] = value
            continue
        keep = (graph_defaults if name == "graph" else pools if name in POOL_KEYED else value)
        if name == "planner_knobs":  # config.json records every knob; --set takes the changed
            # ones only (a planner without knobs refuses any)
            default = msgspec.to_builtins(BackpressureConfig())
            keep = [k for k in value if value[k] != default.get(k)]
        base.update({f"{PREFIX.get(name, name)}.{k}": v for k, v in value.items() if k in keep})
    return {**base, **given}


def differences(prev: dict[str, Any], now: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(shape-changing differences, other changes) between two config.json dicts, each as
    ``"key: old -> new"``. A key the earlier config lacks (written before it was recorded)
    is not compared."""
    shape: list[str] = []
    if "graph_sha256" in prev and prev["graph_sha256"] != now["graph_sha256"]:
        shape.append(f"graph file: {prev.get('graph_file')} (sha256 {prev['graph_sha256'][:12]})"
                     f" -> {now['graph_file']} (sha256 {now['graph_sha256'][:12]})")
    for key in ("graph_name", *SHAPE_KEYS):
        if key in prev and prev[key] != now.get(key):
            shape.append(_change(key, prev[key], now.get(key)))
    for key in ("models", "data", "graph"):
        shape += _nested(key, prev, now)
    other: list[str] = []
    for key in [*RunConfig.__struct_fields__, "workers_total"]:
        if key in SHAPE_KEYS or key == "graph" or key not in prev:
            continue
        if isinstance(prev[key], dict) or isinstance(now.get(key), dict):
            other += _nested(key, prev, now)
        elif prev[key] != now.get(key):
            other.append(_change(key, prev[key], now.get(key)))
    return shape, other


def _nested(key: str, prev: dict[str, Any], now: dict[str, Any]) -> list[str]:
    if key not in prev:
        return []
    old, new = prev[key] or {}, now.get(key) or {}
    return [_change(f"{PREFIX.get(key, key)}.{k}", old.get(k, "(none)"), new.get(k, "(none)"))
            for k in sorted(set(old) | set(new)) if old.get(k, "(none)") != new.get(k, "(none)")]


def _change(key: str, old: Any, new: Any) -> str:
    return f"{key}: {old!r} -> {new!r}"


def newest_run(root: Path, graph_name: str) -> Path | None:
    """The newest ``root/GRAPH-YYYYMMDD-HHMMSS`` run folder (by its name's time) that has a
    checkpoint: what ``--resume auto`` continues when no ``--out`` is given."""
    runs = [p for p in root.glob(f"{graph_name}-*") if p.is_dir()
            and RUN_NAME.search(p.name) and p.name[:-16] == graph_name]
    for path in sorted(runs, key=lambda p: p.name[-15:], reverse=True):
        if checkpoints.latest(path) is not None:
            return path
    return None


@dataclass
class Continuation:
    """Where a run segment starts: the step its checkpoint holds and the records before it,
    so step times, shift counts and the summary go on across resumes (zeros for a fresh
    run)."""

    step: int = 0
    time_s: float = 0.0
    shifts: int = 0
    migrations: int = 0
    steps: list[dict[str, Any]] = field(default_factory=list)  # step, task_accuracy
    worker_restarts: int = 0  # the earlier segments' (from a summary.json before the step)
    segment: int = 0  # 0 for a fresh run, then 1, 2, ... for each resume
    checkpoint: str | None = None  # the folder's name
    history: list[dict[str, Any]] = field(default_factory=list)  # config.json's, so far

    @classmethod
    def of(cls, out: Path, step: int, checkpoint: str, prev: dict[str, Any]) -> Continuation:
        path = out / "metrics.jsonl"
        kept = [r for r in (read_metrics(path) if path.is_file() else [])
                if int(r["step"]) <= step]
        last = kept[-1] if kept else {}
        history = list(prev.get("history") or [])
        summary = _summary_before(out, step)
        return cls(step=step, time_s=float(last.get("time_s") or 0.0),
                   worker_restarts=int(summary.get("worker_restarts") or 0),
                   shifts=int(last.get("shifts") or 0),
                   migrations=int(last.get("migrations") or 0),
                   steps=[{"step": r["step"], "task_accuracy": r.get("task_accuracy")}
                          for r in kept],
                   segment=max(1, len(history)), checkpoint=checkpoint, history=history)

    def carry_onto(self, record: dict[str, Any]) -> None:
        """Put a step record of this segment on the whole run's clock and counts: its time,
        its shift events' times, its path's times, and the shift and migration counts go on
        from the earlier segments'."""
        record["time_s"] += self.time_s
        for event in record.get("shift_events") or ():
            event["time_s"] += self.time_s
        for key in PATH_KEYS:  # the step's path (records.step_path), where it has a time
            if record.get(key) is not None:
                record[key] += self.time_s
        done = record.get("stage_done_s") or {}
        for stage, t in done.items():
            if t is not None:
                done[stage] = t + self.time_s
        record["shifts"] += self.shifts
        record["migrations"] += self.migrations

    def entry(self, cfg: RunConfig, sets: list[str], changes: list[str],
              accepted: list[str], passed_over: list[str]) -> dict[str, Any]:
        """This segment's history entry."""
        out: dict[str, Any] = {"segment": self.segment,
                               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "from_step": self.step, "checkpoint": self.checkpoint,
                               "steps": cfg.steps, "sets": list(sets)}
        if changes:
            out["changes"] = changes
        if accepted:
            out["accepted_changes"] = accepted  # shape-changing, resumed with --accept-changes
        if passed_over:
            out["passed_over"] = passed_over  # damaged newer checkpoints, and why
        return out


def _summary_before(out: Path, step: int) -> dict[str, Any]:
    """The earlier summary.json if all it counts happened up to ``step`` (a run stopped at its
    checkpoint); {} if it is missing, unreadable, or went past the step (the steps after it
    are taken again, so are their counts)."""
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) and summary.get("steps", step + 1) <= step else {}


def refuse(out: Path, shape: list[str]) -> ConfigError:
    return ConfigError(f"--resume {out}: the checkpoint's run differs in what shapes its state: "
                       f"{'; '.join(shape)} (resume with the same settings, or pass "
                       "--accept-changes to resume anyway; config.json's history records it)")


@dataclass
class Segment:
    """One run segment (a fresh run, or one resume of it): where its records go and what it
    continues from."""

    out: Path
    graph_path: str
    cont: Continuation
    config: dict[str, Any]  # config.json; a resume writes it at its first step
    ckpt: checkpoints.Checkpoint | None

    @property
    def log_dir(self) -> Path:  # a resume's worker logs do not overwrite the earlier ones
        logs = self.out / "logs"
        return logs if self.cont.segment == 0 else logs / f"resume-{self.cont.segment}"

    def resume_hint(self, step: int | None) -> str:
        where = (f"checkpoint step {step} in {self.out / 'checkpoints'}" if step is not None
                 else "no step to checkpoint yet")
        return f"{where}; resume with: pivotflow run {self.graph_path} --resume {self.out}"


def resume_point(resume: str | None, out: Path | None, graph_name: str
                  ) -> tuple[Path, checkpoints.Checkpoint | None, list[str]]:
    """The run folder, the checkpoint to continue from (None: a fresh run) and the damaged
    newer checkpoints passed over for it."""
    if resume not in (None, "auto"):
        if out is not None and Path(out).resolve() != Path(resume).resolve():
            raise ConfigError(f"--resume {resume} --out {out}: a resume continues the records "
                              "of the folder it resumes; drop --out")
        out = Path(resume)
    elif resume == "auto" and out is None:
        found = newest_run(Path("runs"), graph_name)
        if found is None:
            raise ConfigError(f"--resume auto: no run of graph {graph_name!r} under "
                              f"{Path('runs').resolve()} has a checkpoint; give --resume DIR, "
                              "or leave --resume out for a fresh run")
        out = found
    out = Path(out or Path("runs") / f"{graph_name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if resume is None:
        return out, None, []
    ckpt, passed_over = checkpoints.newest_whole(out)
    if resume != "auto" and ckpt is None:
        raise ConfigError(f"--resume {resume}: no whole checkpoint under {out / 'checkpoints'}")
    return out, ckpt, passed_over


def read_config(out: Path) -> dict[str, Any]:
    """The earlier run's config.json ({} when it has none: settings then come from the
    command line alone)."""
    path = out / "config.json"
    if not path.is_file():
        return {}
    try:
        return read_json(path)
    except CheckpointError as exc:  # its one line names the file
        raise ConfigError(f"--resume {out}: {exc}") from exc
