"""A controller restored from a snapshot continues as if it had never stopped: no prompt is
skipped, none is trained twice, and the resumed prompts are the ones the first run would have
drawn next."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from harness import Harness, serving
from test_shifts import POOLS

from pivotflow.controller.snapshot import ControllerState, restore, snapshot


async def run_until(h: Harness, stop_at: int | None = None) -> ControllerState | None:
    """Run ``h`` to its end (or stop it after step ``stop_at``, returning the snapshot)."""
    taken: list[ControllerState] = []
    if stop_at is not None:
        def on_step(record: dict) -> None:
            h.records.append(record)
            if record["step"] == stop_at and not taken:
                # through bytes, as a checkpoint file would carry it
                taken.append(msgspec.msgpack.decode(msgspec.msgpack.encode(snapshot(h.ctl)),
                                                    type=ControllerState))
                h.ctl.fail(RuntimeError("stopped"))
        h.ctl.on_step = on_step
    async with serving(h, dict(POOLS)) as (run, _):
        if stop_at is None:
            await asyncio.wait_for(run, 30)
        else:
            with pytest.raises(RuntimeError, match="stopped"):
                await asyncio.wait_for(run, 30)
    return taken[0] if taken else None


@pytest.mark.parametrize("staleness", [0, 1])
async def test_a_restored_controller_trains_every_prompt_exactly_once(staleness: int) -> None:
    kw = {"assignments": dict(POOLS), "group_size": 4, "groups_per_step": 3,
          "max_staleness": staleness}
    whole = Harness(steps=6, **kw)  # type: ignore[arg-type]
    await run_until(whole)
    first = Harness(steps=6, **kw)  # type: ignore[arg-type]
    state = await run_until(first, stop_at=3)
    assert state is not None and state.version == 3
    if staleness:
        assert state.samples  # admitted, not trained: carried over
    second = Harness(steps=6, **kw)  # type: ignore[arg-type]
    restore(second.ctl, state)
    await run_until(second)
    before = [g for r in first.records[:3] for g in r["group_ids"]]
    after = [g for r in second.records for g in r["group_ids"]]
    assert sorted(before + after) == list(range(18))  # once each, none skipped
    assert [r["step"] for r in second.records] == [4, 5, 6]
    # the same prompts and responses, in the same steps, as the run that never stopped
    def trained(h: Harness) -> list[list[tuple[int, ...]]]:
        return [sorted(tuple(q.prompt_ids + q.response_ids) for q in step.seqs)
                for step in h.train_steps]
    assert trained(whole) == trained(first)[:3] + trained(second)
    assert [r["group_ids"] for r in whole.records] == (
        [r["group_ids"] for r in first.records[:3]] + [r["group_ids"] for r in second.records])


async def test_a_checkpoint_takes_partial_generations_and_they_resume() -> None:
    h = Harness(steps=4, assignments=dict(POOLS), group_size=4, groups_per_step=3,
                max_staleness=1)
    taken: list[ControllerState] = []

    def on_step(record: dict) -> None:
        h.records.append(record)
        if record["step"] == 2:
            h.ctl.collector.collect(lambda: taken.append(snapshot(h.ctl)))
    h.ctl.on_step = on_step
    async with serving(h, dict(POOLS), ticks={"w-r0": 0.01, "w-r1": 0.01}) as (run, workers):
        await asyncio.wait_for(run, 30)
    [state] = taken
    partial = [s for s in state.samples if "_partial_saved" in s.fields]
    assert partial  # generations in flight came back with their tokens so far
    restored = Harness(steps=4, assignments=dict(POOLS), group_size=4, groups_per_step=3,
                       max_staleness=1)
    restore(restored.ctl, msgspec.msgpack.decode(msgspec.msgpack.encode(state),
                                                 type=ControllerState))
    queued = [s for e in restored.ctl.edges.values() for s in e.samples()
              if "_partial" in s.private or "_counted" in s.private]
    assert len(queued) == len(partial)
    # the whole run still trained every group once, and no token was sampled twice
    assert h.ctl.ledger.groups_trained == 12 and h.ctl.ledger.duplicates == 0
    trained = sum(len(q.response_ids) for st in h.train_steps for q in st.seqs)
    assert sum(w.policy_tokens for w in workers) == trained


def test_a_samples_routing_comes_back_from_a_checkpoint_as_bytes() -> None:
    """Routing replay's per-sample ``routing`` (bytes, any values) survives state.msgpack as
    the bytes the trainer reads, beside the fields of other types."""
    from pivotflow.controller.snapshot import SampleState

    routing = bytes(range(256)) * 3
    saved = ControllerState(
        version=2, tokens_generated=9, ledger={}, settled_below=0, settled_above=[],
        open_groups={}, next_sample=1, source_rng=[], problems_cursor=0, problems_rng=[],
        samples=[SampleState(sample_id=0, group_id=0, group_size=1, admit_version=1, seed=0,
                             stage=-1, fields={"routing": routing, "response_ids": [1, 2],
                                               "reward": 0.5})])  # fmt: skip
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(saved), type=ControllerState)
    fields = back.samples[0].fields
    assert fields["routing"] == routing and isinstance(fields["routing"], bytes)
    assert fields["response_ids"] == [1, 2] and fields["reward"] == 0.5
