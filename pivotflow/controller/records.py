"""The per-step run record the controller emits (metrics.jsonl keys are an interface)."""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, Any

from pivotflow.controller import stages
from pivotflow.controller.sample import Sample
from pivotflow.protocol import TrainDone

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller


def step_record(ctl: Controller, batch: list[list[Sample]], msg: TrainDone) -> dict[str, Any]:
    """The metrics.jsonl line of one optimizer step (keys in docs/records.md, extras after)."""
    samples = [s for g in batch for s in g]
    rewards = [r for s in samples if (r := s.fields.get("reward")) is not None]
    correct = [s.fields["correct"] for s in samples if s.fields.get("correct") is not None]
    now = ctl.clock.now()
    # samples.jsonl: whoever runs the controller may pass ``on_samples`` (run.py does) to get
    # the step's trained samples themselves, not only the figures below
    if ctl.on_samples is not None:
        ctl.on_samples(batch, msg.step + 1, msg.version)
    return {
        "step": msg.step + 1,
        "time_s": now - ctl.started_at,
        "policy_version": msg.version,
        "samples": len(samples),
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "task_accuracy": sum(correct) / len(correct) if correct else None,
        "pools": {p.name: len(p.workers) for p in ctl.pools.values()},
        "queue_depth": {e.name: len(e) for e in ctl.edges.values()},
        "shifts": ctl.shifts.count,
        "migrations": ctl.shifts.migrations,
        "tokens_generated": ctl.tokens_generated,
        "shift_events": [rec.as_record() for rec in ctl.shifts.unreported()],
        # a sequence's oldest token is its first: versions never decrease along it (a resumed
        # job's prefix keeps its own, new tokens come from weights at least as new), so reading
        # one entry, not all of them (a simulated long tail has thousands per sample)
        "staleness_max": max(msg.version - 1 - (s.fields["versions"] or [msg.version - 1])[0]
                             for s in samples),
        "judge_failures": ctl.ledger.judge_failures,
        "group_ids": sorted(g[0].group_id for g in batch),  # joins ledgers across resumes
        **length_figures(samples),
        **step_path(ctl, samples),
        **tool_figures(samples),
        **field_means(ctl, samples),
        # the graph's own log_metric calls since the previous record (controller/user_metrics)
        **({"logged_metrics": logged} if (logged := ctl.user_metrics.drain()) else {}),
        **partial_figures(ctl, samples, msg.version - 1),
        **ctl.calls.figures(),  # async def stage functions' calls (controller/async_calls.py)
        **{f"train_{k}": v for k, v in msg.stats.items()},
    }


def length_figures(samples: list[Sample]) -> dict[str, Any]:
    """The step's mean and longest response, and the share that ended at the length limit
    rather than on a stop token (verl's ``response_length/clip_ratio``): as responses grow over
    a run, the cap starts to cut them, and a step waits for those capped responses
    (bench/sim_tail.py). A multi-turn sample counts by its last turn's end."""
    lengths = [len(s.fields["response_ids"]) for s in samples]
    return {
        "response_len_mean": sum(lengths) / len(lengths),
        "response_len_max": max(lengths),
        "response_clip_ratio": sum(s.fields.get("finish_reason") == "length" for s in samples)
        / len(samples),
    }


PATH_KEYS = ("admitted_s", "train_ready_s", "train_started_s")  # (and stage_done_s, a dict)


def path_points(record: dict[str, Any]) -> list[tuple[str, float | None]]:
    """A step record's path as (point, time) in order: ``admitted``, each served stage by its
    name, ``ready``, ``started``, ``done`` (``time_s``); None where the record has no time."""
    return [("admitted", record.get("admitted_s")),
            *(record.get("stage_done_s") or {}).items(),
            ("ready", record.get("train_ready_s")), ("started", record.get("train_started_s")),
            ("done", record.get("time_s"))]


def step_path(ctl: Controller, samples: list[Sample]) -> dict[str, Any]:
    """Where the step's time went, as the moments its last sample passed each point (seconds
    since the run started, the clock of ``time_s``): the last of its groups admitted, each
    served stage left by its last sample, the batch complete at the train stage, and the
    optimizer step begun (after any trainers joining it had loaded). The gaps are the step's
    critical path: a long generation tail, a judge queue, trainers loading. A point no sample
    of the step passed in this segment (a resumed sample keeps no times) is null."""
    def last(idx: int) -> float | None:
        times = [t for s in samples if (t := s.reached.get(idx)) is not None]
        return max(times) - ctl.started_at if times else None

    order = ctl.order
    train_idx = next(i for i, n in enumerate(order) if n.kind == "train")
    served = [i for i, n in enumerate(order) if n.kind in stages.SERVED]
    return {"admitted_s": last(1),
            "stage_done_s": {order[i].name: last(i + 1) for i in served},
            "train_ready_s": last(train_idx),
            "train_started_s": ctl.training.started_at - ctl.started_at}


def partial_figures(ctl: Controller, samples: list[Sample], policy: int) -> dict[str, Any]:
    """The share of this step's trained tokens sampled from a version older than the one it
    trains (``policy``; with max_staleness >= 1 most are, carried over or not: the rollout
    runs a version ahead of the trainer), the share generated before a step boundary cut their
    response and carried it over (0 without partial rollouts), and, with partial rollouts on,
    the run's carry-overs and refusals."""
    tokens = old = carried = 0
    for s in samples:
        versions = s.fields["versions"] or []
        tokens += len(versions)
        old += bisect_left(versions, policy)  # non-decreasing along a sequence
        carried += s.private.get(stages.CARRIED, 0)
    out: dict[str, Any] = {"stale_token_share": old / tokens if tokens else 0.0,
                           "carried_token_share": carried / tokens if tokens else 0.0}
    if ctl.partial is not None:
        out.update(carried_over=ctl.partial.carried_over,
                   groups_refused=ctl.partial.groups_refused,
                   tokens_refused=ctl.partial.tokens_refused)
    return out


# written by stages but reported under keys of their own (reward_mean, task_accuracy) or not
# one number a sample (per-token advantages and returns)
_REPORTED_ELSEWHERE = frozenset({"reward", "correct", "advantage", "returns"})


def stage_fields(ctl: Controller) -> list[str]:
    """The fields the graph's ``map`` and ``group`` stages write, but those reported under keys
    of their own (``_REPORTED_ELSEWHERE``), sorted."""
    return sorted({f for n in ctl.order if n.kind in ("map", "group") for f in n.writes}
                  - _REPORTED_ELSEWHERE)


def field_means(ctl: Controller, samples: list[Sample]) -> dict[str, Any]:
    """``field_means``: the step's mean of each number a ``map`` or ``group`` stage writes (a
    verl ``compute_score``'s other keys, each TRL reward function's reward), as verl and TRL
    log them; a None (a function that did not apply) is left out, a bool counts 0 or 1, and a
    field holding no number this step is left out (none for a graph without such stages)."""
    means = {}
    for name in stage_fields(ctl):
        values = [float(v) for s in samples
                  if isinstance(v := s.fields.get(name), int | float) and v == v]
        if values:
            means[name] = sum(values) / len(values)
    return {"field_means": means} if means else {}


def tool_figures(samples: list[Sample]) -> dict[str, Any]:
    """Multi-turn figures of a step's samples (none for a single-turn graph): calls and failed
    calls per sample, policy turns per sample, and how often each kind of problem called."""
    turned = [s.fields for s in samples if "turns" in s.fields]
    if not turned:
        return {}
    n = len(turned)
    return {"tool_calls_per_sample": sum(f["tool_calls"] for f in turned) / n,
            "tool_errors": sum(f["tool_errors"] for f in turned),
            "turns_mean": sum(f["turns"] for f in turned) / n,
            "tool_use_rate": sum(f["tool_calls"] > 0 for f in turned) / n}


def lost_groups(ctl: Controller) -> list[int]:
    """Groups admitted and not trained or filtered that are nowhere in the controller: not
    queued, not in a job, not waiting at a barrier or for the trainer. Must stay empty."""
    present: set[int] = set()
    for edge in ctl.edges.values():
        present.update(s.group_id for s in edge.samples())
    present.update(s.group_id for s, _, _, _ in ctl.jobs.values())
    present.update(s.group_id for s, _ in ctl.tools.waiting.values())
    present.update(s.group_id for samples, _ in ctl.calls.waiting.values() for s in samples)
    present.update(ctl.barriers.group_ids())
    present.update(ctl.train_buffer.ready)
    present.update(s.group_id for s in ctl.training.samples())
    return sorted(set(ctl.train_buffer.open) - present)
