"""The controller's state at an optimizer-step boundary, for checkpoints and ``--resume``.

What it holds: the policy version, the ledger (which groups were trained), the prompt source's
cursor and random states, and every sample of a group admitted but not trained yet, with the
stage it waits at and the fields it has. Periodic checkpoints first take every generation in
flight back as its partial state (``CheckpointCollector.collect``, an abort like a migration's),
so those sequences resume from their tokens so far, with their logprobs and versions; a sample
still queued (or in flight when the run was stopped by Ctrl-C) is generated again, token for
token the same, since sampling noise is a function of (seed, position). Finished samples keep
their tokens, logprobs, versions and rewards. So a resumed run neither skips a prompt nor trains
one twice.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import msgspec

from pivotflow.controller import stages
from pivotflow.controller.sample import Sample, held_out
from pivotflow.controller.train_batch import FIRST, RETRIED, VOID
from pivotflow.controller.turns import AWAITING
from pivotflow.errors import CheckpointError
from pivotflow.protocol import JobDone

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller

TRAIN_BUFFER = -1  # a complete group waiting for the trainer
PARTIAL_SAVED = "_partial_saved"  # a partial generation, as plain lists


class SampleState(msgspec.Struct, kw_only=True):
    sample_id: int
    group_id: int
    group_size: int
    admit_version: int
    seed: int
    stage: int  # index in the graph order where it waits, or TRAIN_BUFFER
    fields: dict[str, Any]


class ControllerState(msgspec.Struct, kw_only=True):
    version: int
    tokens_generated: int
    ledger: dict[str, int]
    settled_below: int  # groups trained or filtered: every id below, and the ids in
    settled_above: list[int]
    open_groups: dict[int, int]  # group id -> admit version
    next_sample: int
    source_rng: list[Any]
    problems_cursor: int
    problems_rng: list[Any]
    samples: list[SampleState]


def _saved(sample: Sample, stage: int) -> SampleState:
    # private state travels in ``fields`` under its ``_`` keys (user fields never start with
    # "_"), so the file format did not change when it moved out of ``fields``
    fields = {**sample.fields, **{k: v for k, v in sample.private.items()
                                  if k not in (stages.PARTIAL, stages.COUNTED)}}
    partial: JobDone | None = sample.private.get(stages.PARTIAL)
    if partial is not None:  # tokens so far, with their logprobs and versions: resumed
        fields[PARTIAL_SAVED] = {"token_ids": list(partial.token_ids),
                                 "logprobs": list(partial.logprobs),
                                 "versions": list(partial.versions)}
    return SampleState(sample_id=sample.sample_id, group_id=sample.group_id,
                       group_size=sample.group_size, admit_version=sample.admit_version,
                       seed=sample.seed, stage=stage, fields=fields)


def snapshot(ctl: Controller) -> ControllerState:
    """The state to checkpoint: between steps, or after the run stopped (a step cut short
    counts as not taken: its groups wait for the trainer again)."""
    saved: list[SampleState] = []
    # (an evaluation round in flight is not kept: its ids are negative, and a resumed run
    # takes the rounds after the last one recorded; controller/evaluation.py)
    for idx, edge in ctl.edges.items():
        saved += [_saved(s, idx) for s in edge.samples() if not held_out(s.group_id)]
    saved += [_saved(s, idx) for s, idx, _, _ in ctl.jobs.values()
              if VOID not in s.private and not held_out(s.group_id)]
    saved += [_saved(s, idx) for s, idx in ctl.tools.waiting.values()  # called again on resume
              if not held_out(s.group_id)]
    saved += [_saved(s, idx) for samples, idx in ctl.calls.waiting.values()  # called again
              for s in samples if not held_out(s.group_id)]
    saved += [_saved(s, idx) for idx, s in ctl.barriers.waiting()]
    saved += [_saved(s, TRAIN_BUFFER) for group in ctl.train_buffer.ready.values() for s in group]
    saved += [_saved(s, TRAIN_BUFFER) for s in ctl.training.samples()]  # a step cut short
    open_groups = dict(ctl.train_buffer.open)
    open_groups.update({s.group_id: s.admit_version for s in ctl.training.samples()})
    counts: dict[int, int] = {}
    for s in saved:
        counts[s.group_id] = counts.get(s.group_id, 0) + 1
    short = {g: counts.get(g, 0) for g in open_groups if counts.get(g, 0) != ctl.source.group_size}
    if short:  # a sample in none of the places above would be lost by a resume: refuse
        raise CheckpointError(f"snapshot at version {ctl.version}: groups {sorted(short)[:5]} "
                              f"have {list(short.values())[:5]} of {ctl.source.group_size} "
                              "samples in the controller; not writing an incomplete checkpoint")
    led = ctl.ledger
    src = ctl.source
    return ControllerState(
        version=ctl.version, tokens_generated=ctl.tokens_generated,
        ledger=led.counters(),
        settled_below=led.settled_below, settled_above=sorted(led.settled_above),
        open_groups=open_groups,
        next_sample=src.next_sample, source_rng=_rng_out(src.rng),
        problems_cursor=src.problems.cursor, problems_rng=_rng_out(src.problems.rng),
        samples=sorted(saved, key=lambda s: s.sample_id))


def restore(ctl: Controller, state: ControllerState) -> None:
    """Put ``state`` into a fresh controller (before ``run``)."""
    ctl.resume_at(state.version, state.tokens_generated)
    ctl.ledger.restore(state.ledger, state.settled_below, state.settled_above)
    ctl.source.restore(state.next_sample, _rng_in(state.source_rng), state.problems_cursor,
                       _rng_in(state.problems_rng))
    now = ctl.clock.now()
    groups: dict[int, list[Sample]] = {}
    for s in state.samples:
        sample = Sample(s.sample_id, s.group_id, s.group_size, s.admit_version, s.seed,
                        {k: v for k, v in s.fields.items() if not k.startswith("_")},
                        private={k: v for k, v in s.fields.items() if k.startswith("_")})
        partial = sample.private.pop(PARTIAL_SAVED, None)
        if partial is not None:
            sample.private[stages.PARTIAL] = JobDone(job_id=-1, finish_reason="abort", **partial)
            sample.private[stages.COUNTED] = len(partial["token_ids"])
        if s.stage == TRAIN_BUFFER:
            groups.setdefault(s.group_id, []).append(sample)
        elif sample.private.get(AWAITING):  # its calls run again when the run starts
            ctl.tools.restore(sample, s.stage)
        elif s.stage in ctl.edges:
            ctl.edges[s.stage].push(sample, now)
        elif ctl.order[s.stage].kind == "map":  # waited on an async def's call: called again
            ctl.calls.restore(s.stage, sample)
        else:  # (a group whose async call was in flight is whole here: called again too)
            ctl.barriers.put_back(s.stage, sample)
    for group in groups.values():
        ctl.train_buffer.add(group)
    firsts: dict[int, int] = {}  # each open group's first job's version (its samples hold it)
    retried: set[int] = set()
    if ctl.train_buffer.partial:
        for s in state.samples:
            first = s.fields.get(FIRST)
            if first is not None:
                firsts[s.group_id] = min(first, firsts.get(s.group_id, first))
            if s.fields.get(RETRIED):
                retried.add(s.group_id)
    ctl.train_buffer.restore({int(g): v for g, v in state.open_groups.items()}, firsts, retried)
    if ctl.partial is not None:  # (a run resumed with a smaller max_staleness, say)
        for group in ctl.train_buffer.refuse(ctl.version):
            ctl.partial.regenerate(group, now)


def _rng_out(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_in(state: list[Any]) -> tuple[Any, ...]:
    return (state[0], tuple(state[1]), state[2])
