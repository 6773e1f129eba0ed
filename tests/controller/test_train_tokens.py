"""What a step's totals count (``pivotflow/controller/train_tokens.py``): a loss mask's zeros
leave tokens, and their advantage, out of the step."""

from __future__ import annotations

import pytest

from pivotflow.controller.train_tokens import carries_signal, valid_tokens
from pivotflow.protocol import TrainSeq


def seq(advantage: float, n: int, mask: list[int] | None = None) -> TrainSeq:
    return TrainSeq(job_id=0, prompt_ids=[1, 2], response_ids=[3] * n, logprobs=[-1.0] * n,
                    versions=[0] * n, advantage=advantage, loss_mask=mask or [])


def test_a_masked_out_sequence_counts_no_token_and_carries_no_signal() -> None:
    assert valid_tokens(seq(1.0, 3)) == 3
    assert valid_tokens(seq(1.0, 3, [1, 0, 1])) == 2
    assert valid_tokens(seq(1.0, 3, [0, 0, 0])) == 0
    assert carries_signal([seq(0.0, 3), seq(-0.5, 2)])
    assert not carries_signal([seq(0.0, 3), seq(0.0, 2)])
    # the only nonzero advantages sit on responses the mask leaves out (truncated, say)
    assert not carries_signal([seq(0.0, 3), seq(1.0, 2, [0, 0]), seq(-1.0, 1, [0])])
    assert carries_signal([seq(0.0, 3), seq(1.0, 2, [0, 1])])


def test_batch_std_divides_each_advantage_by_the_steps_reward_std() -> None:
    import statistics

    from pivotflow.controller.train_tokens import scale_by_batch_std

    rewards = [1.0, 0.0, 1.0, 1.0, None]  # a failed reward is no part of the std
    seqs = [seq(a, 2) for a in (0.25, -0.75, 0.0, 0.0, 0.0)]
    per_token = TrainSeq(job_id=1, prompt_ids=[1], response_ids=[3, 3], logprobs=[-1.0] * 2,
                         versions=[0] * 2, advantage=0.0, token_advantages=[0.5, -0.5])
    std = scale_by_batch_std([*seqs, per_token], rewards)
    assert std == pytest.approx(statistics.stdev([1.0, 0.0, 1.0, 1.0]), rel=1e-12)  # unbiased
    assert [s.advantage for s in seqs] == [0.25 / (std + 1e-4), -0.75 / (std + 1e-4), 0, 0, 0]
    assert per_token.token_advantages == [0.5, -0.5]  # (whitened elsewhere, not here)
    lone = [seq(0.5, 1)]
    assert scale_by_batch_std(lone, [1.0, None]) is None and lone[0].advantage == 0.5


async def test_the_steps_advantages_are_scaled_by_its_rewards_std() -> None:
    """A real controller with batch_std: every trained advantage is the group-mean advantage
    the graph wrote over the std of that step's rewards (read back by sample id)."""
    import asyncio
    import statistics
    from typing import Any

    from harness import Harness, parse, serving, template
    from test_shifts import POOLS

    from pivotflow.graph import Graph
    from pivotflow.rl.group_fns import grpo_advantage_no_std

    written: dict[int, tuple[float, float]] = {}  # sample id -> (reward, advantage written)

    def note(reward: float | None, advantage: float, sample_id: int, **_: Any) -> float:
        written[sample_id] = (reward if reward is not None else float("nan"), advantage)
        return advantage

    g = Graph("t")
    g.model("policy", source="unused")
    g.model("judge", source="unused")
    for pool, n in (("rollout", 2), ("genrm", 1), ("trainer", 1)):
        g.pool(pool, workers=n)
    g.chain(g.source("prompts", task="arithmetic", group_size=4, groups_per_step=3),
            g.generate("rollout", model="policy", pool="rollout", max_tokens=4),
            g.judge("genrm", model="judge", pool="genrm", template=template, parse=parse),
            # (a group's responses are alike here: rewards that differ within it)
            g.map("vary", lambda sample_id, **_: float(sample_id % 3 == 0), writes=["reward"]),
            g.group("advantage", grpo_advantage_no_std, writes=["advantage"]),
            g.map("note", note, writes=["advantage"]),
            g.train("train", model="policy", pool="trainer", batch_std=True))
    h = Harness(steps=3, assignments=dict(POOLS), graph=g)
    async with serving(h, dict(POOLS)) as (run, _):
        await asyncio.wait_for(run, 30)
    scaled = 0
    for step in h.train_steps:
        rewards = [written[q.job_id][0] for q in step.seqs]
        std = statistics.stdev(r for r in rewards if r == r)
        for q in step.seqs:
            assert q.advantage == pytest.approx(written[q.job_id][1] / (std + 1e-4), rel=1e-12)
            scaled += written[q.job_id][1] != 0
    assert scaled > 0  # (some group had spread: the check above was not all zeros)
