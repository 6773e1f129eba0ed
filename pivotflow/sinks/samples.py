"""``samples.jsonl``: a few of each step's trained samples, whole, for a person to read (what
they read first when a reward misbehaves; TRL's log_completions, verl's rollout dumps).

One JSON object per line (keys are an interface, listed in SAMPLE_KEYS; a key whose field the
graph does not write is left out): ``step`` and ``policy_version`` (the step that trained it
and the version it made), ``group_id``, ``sample_id``, ``prompt``, ``answer``, ``response``,
``verdict`` (a judge's text), ``reward``, ``judge_failed``, ``correct``, ``advantage``,
``versions_min``/``versions_max`` (the policy versions its tokens came from: they differ for
an off-policy or resumed generation), ``response_tokens``, ``finish_reason``; multi-turn
stages add ``turns``, ``tool_calls``, ``tool_errors`` and ``trajectory`` (every turn and tool
observation as text); with a critic, ``values`` and ``returns`` (one per response token, as is
then ``advantage``, before the step whitens it); ``stage_fields``, what the graph's own map and
group stages write besides (a verl ``compute_score``'s other keys, each TRL reward function's
reward), as TRL's completions table shows each reward function's column. ``--set
log_samples=N`` picks N per step (-1: all, 0: no file), one from each group in turn, so a
step's lines show as many prompts as they can.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

# sample fields copied as they are (when the graph writes them), in this order
FIELDS = ("prompt", "answer", "response", "verdict", "reward", "judge_failed", "correct",
          "advantage", "finish_reason", "turns", "tool_calls", "tool_errors", "trajectory",
          "values", "returns")
SAMPLE_KEYS = ("step", "policy_version", "group_id", "sample_id", *FIELDS[:8],
               "versions_min", "versions_max", "response_tokens", *FIELDS[8:], "stage_fields")


def pick(batch: list[list[Any]], n: int) -> list[Any]:
    """``n`` samples of a step's groups (-1: all), the first of each group, then the second..."""
    if n < 0:
        return [s for g in batch for s in g]
    out: list[Any] = []
    for i in range(max((len(g) for g in batch), default=0)):
        for group in batch:
            if len(out) == n:
                return out
            if i < len(group):
                out.append(group[i])
    return out


def sample_line(step: int, version: int, sample: Any,
                stage_fields: Sequence[str] = ()) -> dict[str, Any]:
    """One samples.jsonl object for a trained sample (a controller ``Sample``); of the
    ``stage_fields`` (what the graph's map and group stages write) those it holds that no key
    above copies go under ``stage_fields``."""
    f = sample.fields
    line: dict[str, Any] = {"step": step, "policy_version": version,
                            "group_id": sample.group_id, "sample_id": sample.sample_id}
    for key in FIELDS[:8]:
        if key in f:
            line[key] = _jsonable(f[key])
    versions = f.get("versions") or []
    line["versions_min"] = min(versions) if versions else None
    line["versions_max"] = max(versions) if versions else None
    line["response_tokens"] = len(f.get("response_ids") or [])
    for key in FIELDS[8:]:
        if key in f:
            line[key] = _jsonable(f[key])
    own = {k: _jsonable(f[k]) for k in stage_fields if k in f and k not in FIELDS}
    if own:
        line["stage_fields"] = own
    return line


def step_lines(batch: list[list[Any]], step: int, version: int, n: int,
               stage_fields: Sequence[str] = ()) -> list[dict[str, Any]]:
    return [sample_line(step, version, s, stage_fields) for s in pick(batch, n)]


def _jsonable(value: Any) -> Any:
    """A field as JSON: user stage functions may write anything (a numpy float, a custom class):
    numbers and arrays (numpy's, torch's) as their values, anything else msgspec cannot write
    as its repr: never dropped, never an error."""
    return msgspec.to_builtins(value, enc_hook=_as_builtin)


def _as_builtin(obj: Any) -> Any:
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        try:
            return tolist()
        except Exception:  # noqa: BLE001 - an odd object's own method: fall back to its repr
            pass
    return repr(obj)
