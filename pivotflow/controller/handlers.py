"""What the controller does with each message a worker sends (the transport's callbacks).

A result moves its sample on (or back to its queue, when it was aborted for a migration or a
checkpoint); a finished train step advances the policy version; a hello is answered with the
worker's role. Each handler runs to completion on the loop; the transport's flush then calls
``pump`` once for the run of messages. The handlers hold no state of their own: they read the
controller's parts and change them through the parts' methods (the sender's ``WorkerHandle``
through its own: ``heard``, ``ready``; the controller's, e.g. ``new_policy_version``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pivotflow.controller import stages, user_code
from pivotflow.controller.pools import WorkerHandle
from pivotflow.controller.sample import held_out
from pivotflow.errors import WorkerError
from pivotflow.protocol import (
    PROTOCOL_VERSION,
    Heartbeat,
    Hello,
    JobDone,
    JobsDone,
    Reject,
    RoleReady,
    TrainDone,
    Welcome,
    WorkerFailed,
)

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller

log = logging.getLogger("pivotflow.controller")


class Handlers:
    """The controller's message handlers: ``on_message`` and ``on_flush`` are what the
    transport calls."""

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl

    def on_message(self, worker_id: str, msg: Any) -> None:
        try:
            self._on_message(worker_id, msg)
        except Exception as exc:  # a stage function or graph error stops the run, loudly
            log.exception("controller failed handling %s from %s", type(msg).__name__, worker_id)
            self.ctl.fail(exc)

    def on_flush(self) -> None:
        """After a run of messages (the transport's flush): dispatch what became ready, once
        for the run rather than once per message."""
        try:
            self.ctl.pump()
        except Exception as exc:
            log.exception("controller failed dispatching")
            self.ctl.fail(exc)

    def _on_message(self, worker_id: str, msg: Any) -> None:
        ctl = self.ctl
        w = ctl.workers.get(worker_id)
        if w is None:
            log.warning("message %s from unknown worker %r dropped", type(msg).__name__,
                        worker_id)
            return
        if w.state == "dead":  # declared dead (e.g. it was paused past the timeout): too late
            ctl.ledger.count_late()
            return
        now = ctl.clock.now()
        w.heard(now)
        match msg:
            case JobsDone(results=results):
                for r in results:
                    self._on_result(w, r, now)
            case TrainDone():
                self._on_train_done(w, msg)
            case Heartbeat(busy=busy):
                w.set_computing(busy > 0)
            case Hello(protocol_version=pv, pid=pid):
                log.info("worker %s (pid %d) said hello", worker_id, pid)
                self._on_hello(w, pv)
            case RoleReady(version=version):
                w.ready(version, msg.resumed)
                ctl.recovery.mark_served(worker_id)
                ctl.shifts.on_ready(worker_id, msg)
                log.info("worker %s ready: %s %s@v%d (%.2fs)", worker_id, msg.role, msg.model,
                         version, msg.load_s)
            case WorkerFailed(error=error):
                # A worker that served and then failed (e.g. a trainer whose peer died in a
                # collective) is replaced like a dead one; one that never served is a broken
                # setup (bad model, bad options) and stops the run with its error.
                if ctl.recovery.replaces(worker_id):
                    ctl.worker_died(worker_id, f"failed: {error}")
                else:
                    ctl.fail(WorkerError(f"worker {worker_id} (pool {w.pool}) failed: {error}"))

    def _on_hello(self, w: WorkerHandle, protocol_version: int) -> None:
        ctl = self.ctl
        if protocol_version != PROTOCOL_VERSION:
            reason = (f"protocol version {protocol_version} is not the controller's "
                      f"{PROTOCOL_VERSION}; upgrade the worker and the controller together")
            ctl.send(w.worker_id, Reject(reason=reason))
            ctl.fail(WorkerError(f"worker {w.worker_id}: {reason}"))
            return
        ctl.send(w.worker_id, Welcome(protocol_version=PROTOCOL_VERSION,
                                      store_dir=ctl.store_dir_for(w.worker_id),
                                      heartbeat_s=ctl.cfg.heartbeat_s))
        ctl.assign_role(w)

    def _on_result(self, w: WorkerHandle, r: JobDone, now: float) -> None:
        ctl = self.ctl
        entry = ctl.jobs.finished(w, r, now)
        if entry is None:
            ctl.ledger.count_late()  # a result delivered twice, or after re-dispatch
            return
        sample, idx = entry
        node = ctl.order[idx]
        aborted = r.finish_reason == "abort"
        # (a dict lookup per result, not a call, when no shift runs)
        if not aborted and ctl.shifts.active:
            ctl.shifts.on_job_finished(w.worker_id, r.job_id)
        tok = ctl.tok[node.model or ""]
        if node.kind == "generate":
            ctl.count_generated(len(r.token_ids) - sample.private.pop(stages.COUNTED, 0))
        if ctl.partial is not None and ctl.partial.voided(sample, r, idx, w.worker_id):
            return  # its group was refused and is being generated again
        if aborted:  # migration: resume elsewhere from the partial state
            sample.private[stages.PARTIAL] = r
            sample.private[stages.COUNTED] = len(r.token_ids)
            ctl.edges[idx].push(sample, now, front=True)
            carried = ctl.partial is not None and ctl.partial.came_back(r.job_id)
            if carried:
                sample.private[stages.CARRIED] = len(r.token_ids)
            if r.job_id in ctl.collector.waiting:
                ctl.collector.job_back(r.job_id)
            elif not carried:
                ctl.shifts.on_aborted(w.worker_id, r.job_id)
            return
        if r.error:
            ctl.count_generation_error()
            log.warning("job %d (%s, sample %d) failed: %s", r.job_id, node.name,
                        sample.sample_id, r.error)
        if idx in ctl.tools.turns:
            if ctl.tools.on_turn(idx, sample, r):  # its calls run, then the next turn
                ctl.collector.job_back(r.job_id)  # waiting on them, a snapshot sees it
                return
            ctl.rollout_done(sample, idx)
        elif node.kind == "generate":
            stages.apply_generation(sample, r, tok)
            ctl.rollout_done(sample, idx)
        elif node.kind == "reference":
            stages.apply_reference(node, sample, r)
        elif node.kind == "critic":
            stages.apply_values(node, sample, r)
        elif node.kind == "reward_model":
            stages.apply_reward(node, sample, r)
        else:
            ran, judged = user_code.guard(ctl, stages.apply_verdict, node, sample, r, tok)
            if ran and not judged and not held_out(sample.group_id):  # (an evaluation round counts its own)
                ctl.count_judge_failure()
        ctl.advance(sample, idx + 1, now)  # (dropped there if its group was skipped)
        # finished before a checkpoint's abort reached it; only now is the sample somewhere a
        # snapshot sees it (the next stage), so only now may the checkpoint be written
        if ctl.collector.waiting:
            ctl.collector.job_back(r.job_id)

    def _on_train_done(self, w: WorkerHandle, msg: TrainDone) -> None:
        ctl = self.ctl
        done = ctl.training.on_done(w.worker_id, msg)
        if done is None:
            return
        batch, msg = done
        for group in batch:
            ctl.ledger.mark_trained(group[0].group_id, len(group))
        ctl.new_policy_version(msg.version)
        if ctl.partial is not None:  # the step boundary: carry generation over, refuse stale
            ctl.partial.on_new_version(ctl.clock.now())
        if ctl.on_step is not None:
            ctl.on_step(ctl.step_record(batch, msg))
        ctl.shifts.mark_reported()
        ctl.finish_if_trained()
