"""The prompt source: turns tasks or files into groups, admitted under the backpressure quota."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from pivotflow.controller.sample import Sample
from pivotflow.graph import Node
from pivotflow.messages import encode_prompt
from pivotflow.tokenizer.base import Tokenizer

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller


class PromptSource:
    """Admits groups of ``group_size`` samples of one prompt.

    Quota: groups in flight (admitted, not yet trained or filtered) stay under
    ``groups_per_step * (max_staleness + 1)``, and no more groups are admitted than the run's
    steps need; a filtered group frees its slot (dynamic sampling refills it).

    A prompt of chat messages is rendered with the policy's chat template (and ``tools``, the
    multi-turn stage's tool schemas); a string is encoded as is unless the source says
    ``chat_template=True`` (``pivotflow.messages``).
    """

    def __init__(self, node: Node, problems: Any, tok: Tokenizer, *, steps: int,
                 max_staleness: int, seed: int, tools: list[dict[str, Any]] | None = None) -> None:
        self.node = node
        self.problems = problems  # a ProblemStream: next(), check(problem, completion)
        self.tok = tok
        self.group_size = int(node.options["group_size"])
        self.groups_per_step = int(node.options["groups_per_step"])
        self.steps = steps
        self.s = max_staleness
        self.extra = 0  # groups admitted over the quota (partial rollouts' over-sampling)
        self.rng = random.Random(seed)
        self.next_sample = 0
        self.columns = node.options.get("table") is not None
        self.chat_template = bool(node.options.get("chat_template", False))
        self.tools = tools  # (schemas a templated prompt lists: Graph.prompt_tools)

    def restore(self, next_sample: int, rng_state: Any, problems_cursor: int,
                problems_rng_state: Any) -> None:
        """A snapshot's place in the prompts: the next sample id, this source's random state,
        and the problem stream's cursor and random state."""
        self.next_sample = next_sample
        self.rng.setstate(rng_state)
        self.problems.cursor = problems_cursor
        self.problems.rng.setstate(problems_rng_state)

    def quota(self, version: int, filtered: int) -> int:
        n = self.groups_per_step
        return min(n * self.steps, n * (version + self.s + 1) + self.extra) + filtered

    def admit(self, ctl: Controller, now: float) -> list[list[Sample]]:
        groups = []
        ledger = ctl.ledger
        # a skipped group (on_error=skip) is replaced as a filtered one is
        dropped = ledger.groups_filtered + ledger.groups_skipped
        while ledger.prompts_in < self.quota(ctl.version, dropped):
            problem = self.problems.next()
            group_id = ledger.prompts_in
            ledger.prompts_in += 1
            ctl.train_buffer.admitted(group_id, ctl.version)
            prompt_ids = encode_prompt(self.tok, problem.prompt, chat_template=self.chat_template,
                                       tools=self.tools)
            columns = problem.meta if self.columns else {}  # a prompt file's other columns
            group = []
            for _ in range(self.group_size):
                sid = self.next_sample
                self.next_sample += 1
                fields = {**columns, "prompt": problem.prompt, "answer": problem.answer,
                          "prompt_ids": prompt_ids, "prompt_id": self.problems.cursor - 1,
                          "group_id": group_id, "sample_id": sid}
                group.append(Sample(sid, group_id, self.group_size, ctl.version,
                                    self.rng.randrange(2**31), fields))
            groups.append(group)
        return groups

    def check(self, sample: Sample) -> None:
        """Score a finished rollout by the task's exact rule (None where there is no rule)."""
        f = sample.fields
        f["correct"] = self.problems.check(f["answer"], f["response"])
