"""Partial rollouts (``--set partial_rollout=true``): a step never waits for a response still
generating unless ``max_staleness`` makes it, and that response goes on under the newer policy.

The budget: a step's generation is cut when the step's groups are complete. Its groups are the
ones due (a group's first job was sent at version ``f``; step ``f + max_staleness`` must take
it, see TrainBuffer) and then the oldest complete others; a group still queued holds no token
and is due later, so no step waits for it. When the step publishes version ``v``, every policy
generation still in flight is aborted (slime's aborted-samples buffer, AReaL's interruption on
a weight update): its tokens, logprobs and per-token versions come back as a partial state,
and it resumes from that prefix, first in its edge, in a job asking for weights ``v`` or newer
— so its later tokens come from the newer policy and the trainer's importance ratios use the
logprob each token was sampled with. Its oldest token keeps its version, so ``max_staleness``
bounds it: a complete group holding a token older than ``v - max_staleness`` (which the rule
above prevents; a safety net for anything that slips past it) is refused — its tokens thrown
away and the group generated again from its prompt (not dropped: dropping the slow groups would
teach the policy that long answers never count) — and counted.

Over-sampling (``--set over_sample=X``, APRIL): ``X * groups_per_step`` more groups in flight,
and a step no longer waits for a due group: it trains the first complete ones, oldest first.
The due groups left out are refused at the boundary — complete or not: their jobs aborted,
their samples taken from every queue — and generated again from their prompts, now as groups
a step does wait for (so each group is cut once, and a response too long for the bound still
ends). The cut tail's tokens are the price (``tokens_refused``); under a bound on the oldest
token nothing else could happen to them. Exactly-once holds: a refused group stays open and is
trained once, later.

Measured (bench/results/partial_rollout_*.jsonl), neither pays under this bound yet: in the
simulator (dense7b_judge32b, 128 GPUs) on is 0.98x off at max_staleness 1 (0.94x at 2: each
carry-over is a re-prefill, and the engines already move sequences in flight to new weights when a
newer job reaches them), over_sample 0.25/1.0 is 0.94x/0.82x (the cut tail is thrown away, and the
judge judges it too; at max_staleness 2, 0.25/0.5 read 0.84x/0.82x: in the drifting files' late
regime 72% of groups hold a response that runs to the length cap, bench/sim_tail.py, so a step
cannot leave out its slow groups without most of its work); on real processes (grpo_genrm, 200
steps) run time and task_accuracy stay within noise, over_sample 0.5 generating 25% more tokens. On
the drifting files (``bench/sim_paper.py --drift --partial``, 128 GPUs, every baseline from its own
start) on over off is 0.91-1.04 per run, and colocated's phases leave nothing to carry. On real
processes (``bench/elastic.py --drift --max-staleness 1 --partial`` and ``bench/elastic_drift.py
--pairs``) a carry cost a static split 27% until the embedded engine stopped padding the fresh
prompts that join beside the carried prefixes to their length (``pivotflow/batching.py``); since,
on over off is 0.96 on it, 0.95 under backpressure and 1.03 under adaptive (medians of eight
pairs over two sittings; single pairs 0.85-1.13).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pivotflow.controller import stages
from pivotflow.controller.sample import Sample, held_out
from pivotflow.controller.train_batch import RETRIED, VOID, oldest_token
from pivotflow.protocol import AbortJobs, JobDone

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller


class PartialRollouts:
    """The controller's carry-over at each new policy version, and its counts."""

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        policy = ctl.order[-1].model
        # the stages whose model is the one trained (a judge's weights never change)
        self.stages = {i for i in ctl.edges
                       if ctl.order[i].kind == "generate" and ctl.order[i].model == policy}
        self.aborting: set[int] = set()  # job ids aborted at a boundary, not back yet
        self.carried_over = 0  # partial states that came back from a boundary's abort
        self.groups_refused = 0
        self.tokens_refused = 0

    def on_new_version(self, now: float) -> None:
        ctl = self.ctl
        self.aborting &= ctl.jobs.keys()  # (ones whose worker died, or that finished first)
        by_worker: dict[str, list[int]] = {}
        for job_id, (s, idx, wid, _) in ctl.jobs.items():
            # (an evaluation round measures the version it started on: not cut)
            if idx in self.stages and job_id not in self.aborting and not held_out(s.group_id):
                by_worker.setdefault(wid, []).append(job_id)
        for wid, ids in by_worker.items():
            if ctl.send(wid, AbortJobs(job_ids=sorted(ids))):
                self.aborting.update(ids)
        for group in ctl.train_buffer.refuse(ctl.version):
            self.regenerate(group, now)
        for gid in ctl.train_buffer.stale(ctl.version):  # incomplete, past their bound
            found = self._take_group(gid)
            if found is not None:
                self.regenerate(found, now)

    def extra_groups(self, over_sample: float) -> int:
        return math.ceil(over_sample * self.ctl.source.groups_per_step)

    def _take_group(self, gid: int) -> list[Sample] | None:
        """Every sample of an incomplete group, out of the queues, barriers and jobs (those
        jobs aborted, their objects marked void); None where a sample is elsewhere (waiting on
        a tool call, say): the group then goes on, and is refused when complete."""
        ctl = self.ctl
        in_jobs = [(job_id, s, wid) for job_id, (s, _, wid, _) in ctl.jobs.items()
                   if s.group_id == gid]
        queued = sum(1 for e in ctl.edges.values() for s in e.samples() if s.group_id == gid)
        waiting = ctl.barriers.count(gid)
        if len(in_jobs) + queued + waiting != ctl.source.group_size:
            return None
        found = [s for e in ctl.edges.values() for s in e.take_group(gid)]
        found += ctl.barriers.take_group(gid)
        by_worker: dict[str, list[int]] = {}
        for job_id, s, wid in in_jobs:
            s.private[VOID] = True
            found.append(s)
            by_worker.setdefault(wid, []).append(job_id)
        for wid, ids in by_worker.items():
            ctl.send(wid, AbortJobs(job_ids=sorted(ids)))
        return found

    def voided(self, sample: Sample, r: JobDone, idx: int, worker_id: str) -> bool:
        """A job of a refused group came back (aborted, or finished first): dropped."""
        if VOID not in sample.private:
            return False
        ctl = self.ctl
        self.aborting.discard(r.job_id)
        if idx in self.stages:  # its tokens, the prefix too (counted nowhere else)
            self.tokens_refused += len(r.token_ids)
        if r.job_id in ctl.collector.waiting:
            ctl.collector.job_back(r.job_id)
        elif r.finish_reason == "abort":
            ctl.shifts.on_aborted(worker_id, r.job_id)
        return True

    def refused(self, group: list[Sample], now: float) -> bool:
        """A group just complete holds a token no step from now on may train: regenerate."""
        oldest = oldest_token(group)
        if oldest is None or oldest + self.ctl.cfg.max_staleness >= self.ctl.version:
            return False
        self.regenerate(group, now)
        return True

    def came_back(self, job_id: int) -> bool:
        """An aborted job's partial state came back; True if a boundary aborted it."""
        if job_id in self.aborting:
            self.aborting.discard(job_id)
            self.carried_over += 1
            return True
        return False

    def regenerate(self, group: list[Sample], now: float) -> None:
        """Throw away what a refused group generated and send it through the graph again."""
        ctl = self.ctl
        keep = ctl.order[0].writes  # what the source gave it: prompt, ids, a table's columns
        self.groups_refused += 1
        gid = group[0].group_id
        ctl.train_buffer.retry(gid)
        fresh = []
        for s in sorted(group, key=lambda s: s.sample_id):
            # its tokens: a response, or a carried partial state; one in a generation job is
            # counted when the job comes back
            done = s.fields.get("response_ids") or []
            partial = s.private.get(stages.PARTIAL)
            self.tokens_refused += len(done) or (len(partial.token_ids) if partial else 0)
            s.private[VOID] = True  # the old object is never used again
            fresh.append(Sample(s.sample_id, gid, s.group_size, s.admit_version, s.seed,
                                {k: v for k, v in s.fields.items() if k in keep},
                                private={RETRIED: True}))
        for s in fresh:
            ctl.advance(s, 1, now)
