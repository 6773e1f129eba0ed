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

Not built: APRIL's over-sampling (admit more groups than a step needs, train the first
complete ones). Under a bound on the oldest token, the groups over the step's need are still
due at the next step with tokens from this one, so all of them would be refused every step;
its throughput comes from letting carried tokens age one step more, which here is
``max_staleness + 1``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pivotflow.controller.train_batch import oldest_token
from pivotflow.protocol import AbortJobs

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller
    from pivotflow.controller.sample import Sample


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
        for job_id, (_, idx, wid, _) in ctl.jobs.items():
            if idx in self.stages and job_id not in self.aborting:
                by_worker.setdefault(wid, []).append(job_id)
        for wid, ids in by_worker.items():
            if ctl.send(wid, AbortJobs(job_ids=sorted(ids))):
                self.aborting.update(ids)
        for group in ctl.train_buffer.refuse(ctl.version):
            self.regenerate(group, now)

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
        for s in group:
            self.tokens_refused += len(s.fields.get("response_ids") or [])
            s.fields = {k: v for k, v in s.fields.items() if k in keep}
            s.private.clear()
        for s in group:
            ctl._advance(s, 1, now)
