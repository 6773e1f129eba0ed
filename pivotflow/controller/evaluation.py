"""Evaluation rounds: the policy on held-out prompts every ``eval_every`` optimizer steps
(verl's ``test_freq`` with ``val_before_train``, OpenRLHF's ``eval_steps``).

A round admits ``eval_samples`` samples per held-out prompt (one by default) when the policy
reaches a version due (0, every ``eval_every``-th, and the run's last), generated at
``eval_temperature`` (0: greedy, as verl's validation) with the first generate stage's other
settings. With several a prompt's accuracy is their mean (verl's mean@n) and pass@n whether
one of them is right, and pass@k for each power of two k below n the unbiased estimate from
the same samples (``pass_at_k``). Its samples go through the graph's
stages like any other, the judge and map stages included, and leave the flow at the first
stage that waits for a whole group (a group, filter or train stage): they are never grouped,
advantaged or trained, and a reference stage passes them by (a critic scores them, so that a
GAE map after it runs on them as on any sample). What they hold there is the
round's result: the rule-checked accuracy (``correct``, the task's rule), the reward the
judge or a map stage gave, the response lengths.

Their ids are negative (group ``-1 - k``, sample ``-1 - k``), so no training sample, ledger
entry or snapshot ever meets them: a checkpoint leaves a round in flight out, and a resumed
run takes the rounds after the last one recorded. Generating them costs what generating
training samples costs, on the same pools; the planner sees them as queued work.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from pivotflow.controller.records import length_figures
from pivotflow.controller.sample import Sample
from pivotflow.controller.stages import EVAL_TEMPERATURE
from pivotflow.messages import encode_prompt
from pivotflow.tasks.registry import Problem
from pivotflow.tokenizer.base import Tokenizer

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller



def pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float | None:
    """The unbiased pass@k (Chen et al. 2021, arXiv:2107.03374) over prompts given as
    (samples checked, samples right): the mean over prompts of 1 - C(n-c, k) / C(n, k), the
    chance that k of a prompt's n samples drawn without replacement hold one right. Prompts with
    fewer than k samples checked are left out; None when none is left."""
    per_prompt = [1.0 - math.comb(n - c, k) / math.comb(n, k) for n, c in counts if n >= k]
    return sum(per_prompt) / len(per_prompt) if per_prompt else None


class Evaluation:
    """Held-out prompts, the rounds due, and the round in flight (one at a time)."""

    def __init__(self, problems: list[Problem], tok: Tokenizer, *, every: int, steps: int,
                 temperature: float, chat_template: bool, seed: int,
                 samples_per_prompt: int = 1, on_round: Callable[[dict[str, Any]], None],
                 after: int | None = None, tools: list[dict[str, Any]] | None = None) -> None:
        self.problems = problems
        self.prompt_ids = [encode_prompt(tok, p.prompt, chat_template=chat_template,
                                         tools=tools) for p in problems]
        self.every, self.steps, self.temperature = every, steps, temperature
        # the sampling seeds of each prompt's samples, the same every round (rounds differ by
        # the policy only); each prompt's first seed is drawn first, so a prompt's first sample
        # is the same whatever eval_samples says
        self.samples_per_prompt = samples_per_prompt
        rng = random.Random(f"eval/{seed}")
        firsts = [rng.randrange(2**31) for _ in problems]
        self.seeds = [[first] + [rng.randrange(2**31) for _ in range(samples_per_prompt - 1)]
                      for first in firsts]
        self.on_round = on_round
        self.after = -1 if after is None else after  # rounds at versions up to it are recorded
        self.version: int | None = None  # the round in flight
        self.waiting: set[int] = set()  # its samples not back yet (group ids)
        self.results: list[Sample] = []
        self.failed = 0  # its samples a stage function failed on (on_error=skip)
        self.started_s = 0.0
        self.next_id = 0

    def due(self, version: int) -> bool:
        """A round is due at ``version`` (none is in flight, none was taken there)."""
        return (self.version is None and version > self.after
                and (version % self.every == 0 or version == self.steps))

    @property
    def busy(self) -> bool:
        """A round is in flight, or the run's last one is still to come."""
        return self.version is not None or self.after < self.steps

    def admit(self, ctl: Controller, now: float) -> list[Sample]:
        """The samples of the round due at the policy's version, if one is (else none)."""
        if not self.due(ctl.version):
            return []
        self.version, self.started_s = ctl.version, now
        self.results, self.failed = [], 0
        samples = []
        for i, (problem, ids) in enumerate(zip(self.problems, self.prompt_ids, strict=True)):
            for seed in self.seeds[i]:
                k = self.next_id
                self.next_id += 1
                fields = {**problem.meta, "prompt": problem.prompt, "answer": problem.answer,
                          "prompt_ids": ids, "prompt_id": i, "group_id": -1 - k,
                          "sample_id": -1 - k}
                sample = Sample(-1 - k, -1 - k, 1, ctl.version, seed, fields)
                sample.private[EVAL_TEMPERATURE] = self.temperature
                samples.append(sample)
        self.waiting = {s.group_id for s in samples}
        return samples

    def arrive(self, ctl: Controller, sample: Sample, now: float) -> None:
        """A sample of the round reached the first stage that waits for a group: done."""
        if sample.group_id not in self.waiting:
            return
        self.results.append(sample)
        self._one_back(ctl, sample.group_id, now)

    def drop(self, ctl: Controller, group_id: int) -> None:
        """A stage function failed on a sample of the round (``on_error=skip``)."""
        if group_id in self.waiting:
            self.failed += 1
            self._one_back(ctl, group_id, ctl.clock.now())

    def _one_back(self, ctl: Controller, group_id: int, now: float) -> None:
        self.waiting.discard(group_id)
        if self.waiting:
            return
        version, samples = self.version, self.results
        assert version is not None
        checked = [s for s in samples if s.fields.get("correct") is not None]
        correct = [bool(s.fields["correct"]) for s in checked]
        # each prompt's (samples checked, samples right): pass@n and pass@k read these
        n_checked = Counter(s.fields["prompt_id"] for s in checked)
        n_right = Counter(s.fields["prompt_id"] for s in checked if s.fields["correct"])
        counts = [(n, n_right[i]) for i, n in n_checked.items()]
        ks = [2**e for e in range(self.samples_per_prompt.bit_length())
              if 2**e < self.samples_per_prompt]
        rewards = [float(s.fields["reward"]) for s in samples
                   if s.fields.get("reward") is not None]
        versions = [v for s in samples for v in (s.fields.get("versions") or ())]
        lengths = length_figures(samples) if samples else {}
        record: dict[str, Any] = {
            "step": version,
            "time_s": now - ctl.started_at,
            "round_s": now - self.started_s,
            "prompts": len(self.problems),
            "samples_per_prompt": self.samples_per_prompt,
            "temperature": self.temperature,
            "task_accuracy": sum(correct) / len(correct) if correct else None,
            "task_pass_at_n": len(n_right) / len(n_checked) if n_checked else None,
            # (keys are strings: JSON's; k = n is task_pass_at_n, k = 1 mean@n per prompt)
            "task_pass_at_k": {str(k): pass_at_k(counts, k) for k in ks},
            "reward_mean": sum(rewards) / len(rewards) if rewards else None,
            "reward_missing": len(samples) - len(rewards),
            "samples_failed": self.failed,
            "policy_version_min": min(versions) if versions else None,
            "policy_version_max": max(versions) if versions else None,
            **lengths,
        }
        self.after, self.version, self.results = version, None, []
        self.on_round(record)
        ctl.finish_if_trained()  # (the run's last round ends the run)
