"""Partial rollouts (``partial_rollout``): generation in flight at a new policy version is
aborted and resumes from its prefix on the newer weights, a step waits only for the groups
``max_staleness`` makes it, a group holding a token too old is generated again, and every
prompt is still trained exactly once — through a snapshot and a restore too. The controller is
the real one; the workers are TokenWorkers speaking the protocol (harness.py)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from harness import TOK, Harness, serving
from test_shifts import POOLS

from pivotflow.config import resolve
from pivotflow.controller.core import ControllerConfig
from pivotflow.controller.partial import PartialRollouts
from pivotflow.controller.sample import Sample
from pivotflow.controller.snapshot import ControllerState, restore, snapshot
from pivotflow.controller.train_batch import TrainBuffer
from pivotflow.errors import ConfigError

SLOW = {"w-r0": 0.01, "w-r1": 0.01}  # rollouts still generating when a step publishes


def with_partial(h: Harness) -> Harness:
    """``h`` with partial rollouts on (the harness builds its config itself)."""
    ctl = h.ctl
    ctl.cfg.partial_rollout = True
    ctl.train_buffer = TrainBuffer(ctl.source.groups_per_step, ctl.cfg.max_staleness,
                                   partial=True)
    ctl.partial = PartialRollouts(ctl)
    return h


async def stopped_while_generating(h: Harness) -> tuple[int, ControllerState, dict]:
    """Run ``h`` until the first step from step 2 on that ends with rollouts in flight, then
    checkpoint (their partial states come back first) and stop it; returns (that step, the
    state, the buffer's first versions then)."""
    rollout = next(i for i, n in enumerate(h.ctl.order) if n.kind == "generate")
    taken: list = []

    def on_step(record: dict) -> None:
        h.records.append(record)
        busy = any(idx == rollout for _, idx, _, _ in h.ctl.jobs.values())
        if record["step"] >= 2 and busy and not taken:
            h.ctl.collector.collect(lambda: (
                taken.append((record["step"], snapshot(h.ctl), dict(h.ctl.train_buffer.first))),
                h.ctl.fail(RuntimeError("stopped"))))
    h.ctl.on_step = on_step
    async with serving(h, dict(POOLS), ticks=SLOW) as (run, _):
        with pytest.raises(RuntimeError, match="stopped"):
            await asyncio.wait_for(run, 30)
    [(stop, state, firsts)] = taken
    # through bytes, as a checkpoint file carries it
    return stop, msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=ControllerState), firsts


async def run_restored(h: Harness, state: ControllerState) -> None:
    restore(h.ctl, state)
    async with serving(h, dict(POOLS), ticks=SLOW) as (run, _):
        await asyncio.wait_for(run, 30)


def trained_seqs(h: Harness) -> list:
    return [q for st in h.train_steps for q in st.seqs]


def check_exactly_once(h: Harness, groups: int) -> None:
    led = h.ctl.ledger
    assert led.groups_trained == groups and led.duplicates == 0
    assert h.ctl.lost_groups() == []
    ids = [g for r in h.records for g in r["group_ids"]]
    assert sorted(ids) == list(range(groups))


def test_off_by_default_and_a_bad_value_is_one_line() -> None:
    assert ControllerConfig().partial_rollout is False
    assert resolve({}, {}, []).partial_rollout is False
    assert resolve({"partial_rollout": True}, {}, []).partial_rollout is True
    with pytest.raises(ConfigError, match=r"^--set partial_rollout=maybe: Expected `bool`") as info:
        resolve({"partial_rollout": "maybe"}, {}, [])
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=r"^--set over_sample=0.5: .*needs partial_rollout"):
        resolve({"over_sample": 0.5}, {}, [])
    assert resolve({"over_sample": 0.5, "partial_rollout": True}, {}, []).over_sample == 0.5


def test_a_step_waits_for_started_groups_only() -> None:
    """Off, a group admitted at v0 is due at step max_staleness whether it started or not; on,
    only from the version its first job went out at."""
    def group(gid: int) -> list[Sample]:
        return [Sample(gid * 2 + i, gid, 2, 0, 0, {"versions": [1, 1]}) for i in range(2)]
    for partial in (False, True):
        buf = TrainBuffer(1, 1, partial=partial)
        for gid in (0, 1):
            buf.admitted(gid, 0)
        buf.started(1, 1)  # group 0 is still queued; group 1 went out at v1
        buf.add(group(1))
        assert buf.can_take(1) is partial  # off: step 1 waits for group 0 (admitted at v0)
    buf = TrainBuffer(1, 0, partial=True)
    buf.admitted(0, 0)
    buf.started(0, 0)
    buf.add([Sample(0, 0, 1, 0, 0, {"versions": [0, 1]})])
    [refused] = buf.refuse(1)  # a token of v0 cannot be trained from v1 on with staleness 0
    assert refused[0].group_id == 0 and not buf.ready and 0 in buf.open


async def test_carried_over_generations_resume_on_the_newer_policy_exactly_once() -> None:
    h = with_partial(Harness(steps=6, assignments=dict(POOLS), group_size=4, groups_per_step=3,
                             max_staleness=1))
    async with serving(h, dict(POOLS), ticks=SLOW) as (run, workers):
        await asyncio.wait_for(run, 30)
    check_exactly_once(h, 18)
    assert h.ctl.partial is not None and h.ctl.partial.carried_over > 0
    assert all(r["staleness_max"] <= 1 for r in h.records)
    seqs = trained_seqs(h)
    # resumed from its prefix: no token sampled twice, and each response is the one a sequence
    # generated in one go makes (tokens are a function of prompt and position here)
    assert sum(w.policy_tokens for w in workers) == sum(len(q.response_ids) for q in seqs)
    for q in seqs:
        assert q.response_ids == h.expect(list(q.prompt_ids), "policy")
        assert q.versions == sorted(q.versions) and len(q.logprobs) == len(q.response_ids)
    # carried over: older tokens keep their version, the rest come from the newer policy
    assert any(q.versions[0] < q.versions[-1] for q in seqs)
    assert any(r["stale_token_share"] > 0 for r in h.records)
    # tokens carried over a boundary came from weights older than any step after it trains
    assert any(r["carried_token_share"] > 0 for r in h.records)
    assert all(r["carried_token_share"] <= r["stale_token_share"] for r in h.records)


async def test_a_group_holding_tokens_too_old_is_generated_again() -> None:
    """A run checkpointed at max_staleness 1 and restored with 0 (its groups hold tokens one
    version old): those groups are refused and generated again, never trained stale."""
    kw = {"assignments": dict(POOLS), "group_size": 4, "groups_per_step": 3}
    first = Harness(steps=6, max_staleness=1, **kw)  # type: ignore[arg-type]
    stop, state, _ = await stopped_while_generating(first)
    second = with_partial(Harness(steps=6, max_staleness=0, **kw))  # type: ignore[arg-type]
    await run_restored(second, state)
    part = second.ctl.partial
    assert part is not None and part.groups_refused > 0 and part.tokens_refused > 0
    assert all(r["staleness_max"] == 0 and r["stale_token_share"] == 0 for r in second.records)
    before = [g for r in first.records[:stop] for g in r["group_ids"]]
    after = [g for r in second.records for g in r["group_ids"]]
    assert sorted(before + after) == list(range(18))  # once each, none lost to a refusal
    assert second.ctl.ledger.duplicates == 0 and second.ctl.lost_groups() == []
    for q in trained_seqs(second):
        assert q.response_ids == second.expect(list(q.prompt_ids), "policy")


async def test_a_snapshot_keeps_carried_partials_and_first_versions() -> None:
    kw = {"assignments": dict(POOLS), "group_size": 4, "groups_per_step": 3,
          "max_staleness": 1}
    first = with_partial(Harness(steps=6, **kw))  # type: ignore[arg-type]
    stop, state, firsts = await stopped_while_generating(first)
    partials = [s for s in state.samples if "_partial_saved" in s.fields]
    assert partials  # carried-over generations, with their tokens, logprobs and versions
    assert all(len(s.fields["_partial_saved"]["versions"]) > 0 for s in partials)
    second = with_partial(Harness(steps=6, **kw))  # type: ignore[arg-type]
    restore(second.ctl, state)
    assert second.ctl.train_buffer.first == firsts  # every group's staleness base came back
    async with serving(second, dict(POOLS), ticks=SLOW) as (run, _):
        await asyncio.wait_for(run, 30)
    before = [g for r in first.records[:stop] for g in r["group_ids"]]
    after = [g for r in second.records for g in r["group_ids"]]
    assert sorted(before + after) == list(range(18))
    assert all(r["staleness_max"] <= 1 for r in second.records)
    for q in trained_seqs(second):
        assert q.response_ids == second.expect(list(q.prompt_ids), "policy")
    assert TOK.eos_id in trained_seqs(second)[0].response_ids


def with_over_sample(h: Harness, over: float) -> Harness:
    """``h`` with partial rollouts and over-sampling on."""
    ctl = with_partial(h).ctl
    ctl.cfg.over_sample = over
    ctl.train_buffer.skip_tail = True
    assert ctl.partial is not None
    ctl.source.extra = ctl.partial.extra_groups(over)
    return h


async def test_over_sampling_cuts_the_tail_once_and_trains_every_group_once() -> None:
    """More groups in flight than a step needs; steps take the first complete ones and the due
    groups left out are refused (their jobs aborted and dropped, wherever their samples were)
    and generated again, once, as groups a step waits for."""
    h = with_over_sample(Harness(steps=8, assignments=dict(POOLS), group_size=4,
                                 groups_per_step=3, max_staleness=1), 1.0)
    ticks = {"w-r0": 0.004, "w-r1": 0.02}  # one slow rollout worker: a tail
    async with serving(h, dict(POOLS), ticks=ticks) as (run, workers):
        await asyncio.wait_for(run, 60)
        await asyncio.sleep(0.05)  # voided jobs' aborts come back
    check_exactly_once(h, 24)
    part = h.ctl.partial
    assert part is not None and part.groups_refused > 0 and part.tokens_refused > 0
    assert all(r["staleness_max"] <= 1 for r in h.records)
    seqs = trained_seqs(h)
    assert len({q.job_id for q in seqs}) == len(seqs) == 24 * 4  # no sample trained twice
    for q in seqs:
        assert q.response_ids == h.expect(list(q.prompt_ids), "policy")
    # every policy token sampled was trained, or counted as refused (the cut tail)
    trained = sum(len(q.response_ids) for q in seqs)
    assert sum(w.policy_tokens for w in workers) == trained + part.tokens_refused


async def test_a_snapshot_while_over_sampling_resumes_exactly_once() -> None:
    kw = {"assignments": dict(POOLS), "group_size": 4, "groups_per_step": 3,
          "max_staleness": 1}
    first = with_over_sample(Harness(steps=8, **kw), 1.0)  # type: ignore[arg-type]
    stop, state, _ = await stopped_while_generating(first)
    counts: dict[int, int] = {}
    for s in state.samples:  # a void object (a refused group's job) is never saved
        counts[s.group_id] = counts.get(s.group_id, 0) + 1
    assert set(counts.values()) == {4}
    second = with_over_sample(Harness(steps=8, **kw), 1.0)  # type: ignore[arg-type]
    await run_restored(second, state)
    before = [g for r in first.records[:stop] for g in r["group_ids"]]
    after = [g for r in second.records for g in r["group_ids"]]
    assert sorted(before + after) == list(range(24))
    assert all(r["staleness_max"] <= 1 for r in second.records)
