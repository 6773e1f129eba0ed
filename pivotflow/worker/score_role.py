"""The score role: a frozen model that scores responses instead of generating them: a reference
model's logprobs, or a reward model's score.

A reference stage (``Graph.reference``) sends each sample as a GenerateJob whose ``prompt_ids``
are the prompt and ``prefix_ids`` the response; the role answers with the log-probability of
every response token under its weights (``logprobs``, one per token, ``token_ids`` empty,
``finish_reason`` "scored"). The trainer turns those into the KL penalty (GRPO's beta term).

It runs the trainer's own forward (``train_role.pack`` and ``response_scoring``), in
inference mode, so a token is scored exactly as the trainer scores it: at step 0, when the
policy still is the reference, the KL the trainer reports is zero up to float rounding. It is
a pool's role like any other, so the planner can shift workers to and from it; its weights are
one version that never changes (the run publishes the policy's initial weights under
``<model>.ref``). ``micro_batch_tokens`` bounds one forward pass as it does the trainer's; one
``step`` runs one such pass, so an abort waits for at most one.

On a sequence classifier (a reward model, ``Graph.reward_model``) a job's ``prompt_ids`` are the
whole sequence the reward model reads (its own chat template's rendering of the prompt and the
response) and the answer is one ``score`` at its last token (``reward_scoring.py``).

A critic (``Graph.critic``, PPO's value model) is a one-label classifier too; its jobs carry a
response (``prefix_ids``), which a reward model's never do, and the answer is the value before
each response token (``values``). Its weights change every step (the trainer steps it with the
policy), so a job asking for a newer version than the role holds (``min_version``) reloads the
newest from the store first, as a rollout engine does.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import torch

from pivotflow.engines.torch.weights import build_model, config_from_hf, resolve_dtype
from pivotflow.params.base import VERSION_WAIT_S, ParamStore, load_newer
from pivotflow.protocol import GenerateJob, JobDone, TrainSeq
from pivotflow.worker.response_scoring import response_logprobs
from pivotflow.worker.reward_scoring import response_values, sequence_scores
from pivotflow.worker.train_config import train_config
from pivotflow.worker.train_role import micro_batches, pack, pad_sequences
from pivotflow.worker.worker_config import worker_config

SCORED = "scored"  # the finish_reason of a scored job
# Response positions the output head scores at a time when the run sets no logits_chunk_tokens:
# without autograd a chunk costs nothing (no recompute), and 512 positions of a 152k vocabulary
# hold 0.3 GB of logits where a whole 4096-token micro-batch held 2.5 GB, twice.
SCORE_CHUNK_TOKENS = 512


class ScoreRole:
    """Queued jobs scored a micro-batch per step; the GenerateLike interface of host.py."""

    def __init__(self, store: ParamStore, model: str, options: dict) -> None:
        t0 = time.perf_counter()
        self.store, self.model_name = store, model
        self._version, hf_config, tensors = store.load(model)
        where = f"config of {model}@v{self._version} (parameter store {store.root})"
        self.config = config_from_hf(hf_config, where)
        wc = worker_config(options)
        self.device = torch.device(wc.device)
        dtype = resolve_dtype(hf_config, wc.dtype, where)
        t_build = time.perf_counter()
        self.model = build_model(self.config, tensors, self.device, dtype)
        tc = train_config(options)
        self.budget, self.chunk = tc.micro_batch_tokens, tc.logits_chunk_tokens or SCORE_CHUNK_TOKENS
        self.queue: OrderedDict[int, tuple[GenerateJob, float]] = OrderedDict()
        self.warmup_s = time.perf_counter() - t_build
        self.load_s = time.perf_counter() - t0

    @property
    def version(self) -> int:
        return self._version

    def add(self, jobs: list[GenerateJob]) -> list[JobDone]:
        """Queue jobs; returns at once those that cannot be scored (with their error)."""
        now = time.perf_counter()
        need = max((j.min_version for j in jobs), default=0)
        if need > self._version:
            self._refresh(need)
        rejected = []
        for j in jobs:
            problem = self._problem(j)
            if problem:
                rejected.append(JobDone(job_id=j.job_id, token_ids=[], logprobs=[], versions=[],
                                        finish_reason="error", error=problem))
            else:
                self.queue[j.job_id] = (j, now)
        return rejected

    def _refresh(self, min_version: int) -> None:
        """Load the newest version of the weights (a critic's), as a rollout engine does."""
        def load() -> int:
            self._version, _, tensors = self.store.load(self.model_name)
            with torch.no_grad():
                self.model.load_state_dict(tensors, strict=False)
            return self._version

        load_newer(self.store, self.model_name, min_version, load, VERSION_WAIT_S)

    def _problem(self, j: GenerateJob) -> str:
        ids = j.prompt_ids + j.prefix_ids
        if not self.config.num_labels:
            if not j.prompt_ids or not j.prefix_ids:
                return (f"job {j.job_id}: a reference score needs a prompt and a response "
                        f"(got {len(j.prompt_ids)} and {len(j.prefix_ids)} tokens)")
            what = "reference model"
        else:
            if not j.prompt_ids:
                return f"job {j.job_id}: a reward model or critic needs a sequence to score"
            what = "critic" if j.prefix_ids else "reward model"
        if len(ids) > self.config.context_limit:
            return (f"job {j.job_id}: {len(ids)} tokens exceed the {what}'s "
                    f"{self.config.context_key} {self.config.context_limit}")
        bad = next((t for t in ids if not 0 <= t < self.config.vocab_size), None)
        if bad is not None:
            return (f"job {j.job_id}: token id {bad} is outside the {what}'s "
                    f"vocabulary (vocab_size {self.config.vocab_size})")
        return ""

    def has_work(self) -> bool:
        return bool(self.queue)

    def step(self) -> list[JobDone]:
        """Score the first micro-batch of the queue (by length, as the trainer cuts them)."""
        seqs = [TrainSeq(job_id=j.job_id, prompt_ids=j.prompt_ids, response_ids=j.prefix_ids,
                         logprobs=[0.0] * len(j.prefix_ids), versions=[], advantage=0.0)
                for j, _ in self.queue.values()]
        part = micro_batches(seqs, self.budget)[0]
        whole = [s for s in part if not s.response_ids] if self.config.num_labels else []
        if whole:  # a reward model's (or a critic's with an empty response: no values)
            return self._rewards(whole)
        critic = bool(self.config.num_labels)
        batch = {k: v.to(self.device) for k, v in pack(part).items()}
        with torch.inference_mode():
            scored = (response_values(self.model, batch) if critic
                      else response_logprobs(self.model, batch, self.chunk)).cpu()
        now = time.perf_counter()
        out = []
        for i, s in enumerate(part):
            _, arrived = self.queue.pop(s.job_id)
            n = len(s.response_ids)
            row = scored[i, :n].tolist()
            out.append(JobDone(job_id=s.job_id, token_ids=[], logprobs=[] if critic else row,
                               versions=[self._version] * n, finish_reason=SCORED,
                               worker_s=now - arrived, values=row if critic else []))
        return out

    def _rewards(self, part: list[TrainSeq]) -> list[JobDone]:
        """A reward model's micro-batch: each whole sequence's score."""
        batch = {k: v.to(self.device) for k, v in
                 pad_sequences([s.prompt_ids for s in part]).items()}
        with torch.inference_mode():
            scores = sequence_scores(self.model, batch).cpu().tolist()
        now = time.perf_counter()
        out = []
        for s, score in zip(part, scores, strict=True):
            _, arrived = self.queue.pop(s.job_id)
            out.append(JobDone(job_id=s.job_id, token_ids=[], logprobs=[], versions=[],
                               finish_reason=SCORED, worker_s=now - arrived, score=score))
        return out

    def abort(self, job_ids: list[int]) -> list[JobDone]:
        """Drop queued jobs (all when empty); a score has no partial state to carry."""
        ids = list(self.queue) if not job_ids else [j for j in job_ids if j in self.queue]
        for j in ids:
            del self.queue[j]
        return [JobDone(job_id=j, token_ids=[], logprobs=[], versions=[], finish_reason="abort")
                for j in ids]

    def release(self) -> None:
        self.queue.clear()
        del self.model
