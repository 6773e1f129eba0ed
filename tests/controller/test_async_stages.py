"""``async def`` map, group and filter functions: awaited on the controller's loop while the run
goes on, at most the stage's ``concurrency`` at once, under the stage's deadline, with
``on_error`` as for plain functions, and saved by a snapshot while in flight (called again on
resume: every group trained exactly once)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from harness import Harness, parse, serving, template
from test_shifts import POOLS

from pivotflow.controller.snapshot import ControllerState, restore, snapshot
from pivotflow.errors import StageError
from pivotflow.graph import Graph
from pivotflow.rl.group_fns import grpo_advantage


def chain_graph(middle: Callable[[Graph], list[Any]], parse_fn: Any = parse,
                judge: bool = True) -> Graph:
    """prompts -> rollout -> [genrm] -> middle(g)'s stages -> advantage -> train."""
    g = Graph("t")
    g.model("policy", source="unused")
    g.model("judge", source="unused")
    for pool, n in (("rollout", 2), ("genrm", 1), ("trainer", 1)):
        g.pool(pool, workers=n)
    src = g.source("prompts", task="arithmetic", group_size=2, groups_per_step=2)
    gen = g.generate("rollout", model="policy", pool="rollout", max_tokens=4)
    jud = [g.judge("genrm", model="judge", pool="genrm", template=template,
                   parse=parse_fn)] if judge else []
    g.chain(src, gen, *jud, *middle(g),
            g.train("train", model="policy", pool="trainer"))
    return g


def async_graph(bonus: Any, advantage: Any = None, keep: Any = None, *,
                concurrency: int = 64, deadline_s: float | None = 60.0,
                on_error: str = "stop") -> Graph:
    """prompts -> rollout -> genrm -> bonus (map) -> [keep] -> advantage (group) -> train."""
    def middle(g: Graph) -> list[Any]:
        bon = g.map("bonus", bonus, writes=["reward", "bonus_seen"], concurrency=concurrency,
                    deadline_s=deadline_s, on_error=on_error)
        adv = g.group("advantage", advantage or grpo_advantage, writes=["advantage"])
        return [bon] + ([g.filter("keep", keep)] if keep else []) + [adv]

    return chain_graph(middle)


async def run_to_end(h: Harness, timeout: float = 30) -> None:
    async with serving(h, dict(POOLS)) as (run, _):
        await asyncio.wait_for(run, timeout)


async def test_async_stages_are_awaited_beside_the_run_up_to_their_concurrency() -> None:
    from pivotflow.sinks.prometheus import render

    now, most, scraped = [0], [0], []

    async def bonus(reward: float | None, group_id: int, **_: Any) -> dict[str, Any]:
        if not scraped:  # what /metrics shows while a call is out
            scraped.append(render(h.ctl, None))
        now[0] += 1
        most[0] = max(most[0], now[0])
        await asyncio.sleep(0.02)  # a reward server's round trip
        now[0] -= 1
        return {"reward": (reward or 0.0) + 0.5, "bonus_seen": group_id}

    async def advantage(reward: list[float], bonus_seen: list[int],
                        **_: Any) -> dict[str, list[float]]:
        await asyncio.sleep(0)
        assert len(set(bonus_seen)) == 1  # the group's own samples, each through the map
        return grpo_advantage(reward)

    async def keep(reward: list[float], **_: Any) -> bool:
        await asyncio.sleep(0)
        return all(r >= 0.5 for r in reward)  # the bonus was written before the filter ran

    h = Harness(steps=4, assignments=dict(POOLS),
                graph=async_graph(bonus, advantage, keep, concurrency=2))
    await run_to_end(h)
    groups = sorted(g for r in h.records for g in r["group_ids"])
    assert groups == list(range(8))  # once each
    assert most[0] == 2  # calls overlapped, never past the stage's concurrency
    assert h.ctl.calls.in_flight() == 0
    assert h.ctl.ledger.groups_filtered == 0 and h.ctl.lost_groups() == []
    rewards = [r["reward_mean"] for r in h.records]
    assert all(r >= 0.5 for r in rewards)  # every trained sample carries the awaited reward
    for r in h.records:  # the calls' figures, by stage
        assert set(r["stage_calls_waiting"]) == {"bonus", "keep", "advantage"}
        assert r["stage_call_ms_p50"]["bonus"] >= 19.0  # (each sleeps 20 ms)
    assert 'pivotflow_stage_calls_waiting{stage="bonus"} ' in scraped[0]
    assert "stage_calls_waiting" not in Harness(steps=1, assignments=dict(POOLS)).ctl \
        .calls.figures()  # (nothing awaited: no keys)


async def test_a_lambda_returning_a_coroutine_is_awaited_too() -> None:
    async def score(reward: float | None, **_: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"reward": 2.0, "bonus_seen": 1}

    h = Harness(steps=2, assignments=dict(POOLS),
                graph=async_graph(lambda reward, **_: score(reward)))
    await run_to_end(h)
    assert [r["reward_mean"] for r in h.records] == [2.0, 2.0]


@pytest.mark.parametrize("blocking", [False, True])
async def test_an_async_stage_past_its_deadline_stops_the_run_naming_it(blocking: bool) -> None:
    async def bonus(reward: float | None, **_: Any) -> dict[str, Any]:
        if blocking:
            time.sleep(60)  # holds the loop: the watchdog interrupts the step
        await asyncio.sleep(60)  # awaits: asyncio.timeout ends it
        return {}

    h = Harness(steps=2, assignments=dict(POOLS), graph=async_graph(bonus, deadline_s=0.3))
    started = time.monotonic()
    async with serving(h, dict(POOLS)) as (run, _):
        with pytest.raises(StageError) as info:
            await asyncio.wait_for(run, 20)
    assert time.monotonic() - started < 10
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("map 'bonus' at ") and "test_async_stages.py:" in msg
    assert "on sample" in msg and "ran longer than its deadline_s=0.3" in msg


async def test_an_async_stage_that_raises_skips_its_group_with_on_error_skip() -> None:
    async def bonus(reward: float | None, group_id: int, **_: Any) -> dict[str, Any]:
        await asyncio.sleep(0.001)
        if group_id == 3:
            raise ValueError("the reward server said 502")
        return {"reward": reward, "bonus_seen": group_id}

    h = Harness(steps=3, assignments=dict(POOLS),
                graph=async_graph(bonus, on_error="skip"))
    await run_to_end(h)
    trained = sorted(g for r in h.records for g in r["group_ids"])
    assert 3 not in trained and len(trained) == 6
    assert h.ctl.ledger.groups_skipped == 1 and h.ctl.lost_groups() == []


async def test_an_async_stage_that_raises_stops_the_run_with_one_line() -> None:
    async def bonus(reward: float | None, **_: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        raise ConnectionError("reward server at 127.0.0.1:9 refused\nthe connection")

    h = Harness(steps=2, assignments=dict(POOLS), graph=async_graph(bonus))
    async with serving(h, dict(POOLS)) as (run, _):
        with pytest.raises(StageError) as info:
            await asyncio.wait_for(run, 20)
    assert str(info.value).endswith(
        "function raised ConnectionError: reward server at 127.0.0.1:9 refused the connection")


async def test_a_judge_parse_that_is_async_is_a_clear_error() -> None:
    async def parse_async(verdict: str, **_: Any) -> float:
        return 1.0

    g = chain_graph(lambda g: [g.group("advantage", grpo_advantage, writes=["advantage"])],
                    parse_fn=parse_async)
    h = Harness(steps=2, assignments=dict(POOLS), graph=g)
    async with serving(h, dict(POOLS)) as (run, _):
        with pytest.raises(StageError, match="parse returned an awaitable .*only map, group "
                                             "and filter functions may be async"):
            await asyncio.wait_for(run, 20)


BLOCKED: set[str] = set()  # which stages' calls hang (the first run); none in the second


async def hang_if_blocked(stage: str) -> None:
    if stage in BLOCKED:
        await asyncio.Event().wait()


async def slow_bonus(reward: float | None, group_id: int, **_: Any) -> dict[str, Any]:
    if group_id >= 5:
        await hang_if_blocked("map")
    await asyncio.sleep(0.001)
    return {"reward": reward, "bonus_seen": group_id}


async def slow_advantage(reward: list[float], bonus_seen: list[int],
                         **_: Any) -> dict[str, list[float]]:
    if bonus_seen[0] == 4:
        await hang_if_blocked("group")
    return grpo_advantage(reward)


async def test_calls_in_flight_are_saved_by_a_snapshot_and_called_again_on_resume() -> None:
    def harness() -> Harness:
        return Harness(steps=6, assignments=dict(POOLS), max_staleness=2,
                       graph=async_graph(slow_bonus, slow_advantage))

    BLOCKED.update({"map", "group"})
    first, taken = harness(), []

    def on_step(record: dict) -> None:
        first.records.append(record)
        if record["step"] == 2 and not taken:  # groups 0-3 trained; 4 and on hang
            async def later() -> None:  # (once the hung calls have started)
                while first.ctl.calls.in_flight() < 3:
                    await asyncio.sleep(0.01)
                taken.append(msgspec.msgpack.decode(msgspec.msgpack.encode(
                    snapshot(first.ctl)), type=ControllerState))
                first.ctl.fail(RuntimeError("stopped"))
            asyncio.get_running_loop().create_task(later())
    first.ctl.on_step = on_step
    try:
        async with serving(first, dict(POOLS)) as (run, _):
            with pytest.raises(RuntimeError, match="stopped"):
                await asyncio.wait_for(run, 30)
    finally:
        BLOCKED.clear()
    state = taken[0]
    order = [n.name for n in first.ctl.order]
    at = {s.stage for s in state.samples}
    assert order.index("bonus") in at and order.index("advantage") in at  # both kinds saved
    second = harness()
    restore(second.ctl, state)
    await run_to_end(second)
    before = [g for r in first.records[:2] for g in r["group_ids"]]
    after = [g for r in second.records for g in r["group_ids"]]
    assert sorted(before + after) == list(range(12))  # once each, none skipped
    assert second.ctl.lost_groups() == [] and second.ctl.calls.in_flight() == 0


async def test_a_reward_server_is_called_beside_the_run_with_the_policys_text() -> None:
    """OpenRLHF's remote reward (rl/openrlhf_reward.py) against a real server on loopback
    (examples/reward_server.py, 50 ms a request): the controller decodes ``prompt_text`` and
    ``sequence_text`` because the stage names them, requests overlap, every group trains."""
    from pathlib import Path

    from script_modules import load_script

    from pivotflow.rl.openrlhf_reward import openrlhf_reward

    root = Path(__file__).resolve().parents[2]
    server = load_script(root / "examples" / "reward_server.py").serve_in_thread(latency_s=0.05)
    try:
        g = chain_graph(lambda g: [
            g.map("reward", openrlhf_reward(server.url()), writes=["reward"]),
            g.group("advantage", grpo_advantage, writes=["advantage"])], judge=False)
        h = Harness(steps=4, assignments=dict(POOLS), graph=g)
        assert h.ctl.wants_texts
        await run_to_end(h)
    finally:
        server.shutdown()
        server.server_close()
    assert sorted(g for r in h.records for g in r["group_ids"]) == list(range(8))
    assert server.queries >= 16 and server.most_at_once > 1  # the run did not wait on each
    sent = server.seen[-1]
    query, prompt = sent["query"][0], sent["prompts"][0]
    assert query.startswith(prompt) and query.endswith("<eos>") and "=" in prompt
    assert sent["labels"][0].isdigit()  # the built-in sums' answer column
    assert not Harness(steps=1, assignments=dict(POOLS)).ctl.wants_texts  # not decoded unasked


async def test_a_code_reward_runs_each_program_in_the_sandbox_beside_the_run() -> None:
    """``code_reward`` (rl/code_reward.py) as a map stage of a real controller: each sample's
    program (here: one printing its completion) runs in a bubblewrap sandbox against the
    sample's own cases, which the even samples pass and the odd fail: every step's reward
    mean is exactly 0.5, and every group trains."""
    from pivotflow.rl.code_reward import code_reward

    def tests(completion: str, sample_id: int, **_: Any) -> dict[str, Any]:
        want = completion if sample_id % 2 == 0 else completion + "!"
        return {"tests": {"inputs": [""], "outputs": [want]}}

    g = chain_graph(lambda g: [
        g.map("tests", tests, writes=["tests"]),
        g.map("reward", code_reward(timeout_s=5.0, extract=lambda c: f"print({c!r})"),
              writes=["reward"]),
        g.group("advantage", grpo_advantage, writes=["advantage"])], judge=False)
    h = Harness(steps=3, assignments=dict(POOLS), graph=g)
    await run_to_end(h, timeout=60)
    assert sorted(g for r in h.records for g in r["group_ids"]) == list(range(6))
    assert [r["reward_mean"] for r in h.records] == [0.5] * 3
    assert h.records[-1]["logged_metrics"]["code_ok"] == 0.5


async def test_a_slime_reward_runs_on_a_controllers_samples() -> None:
    """slime's custom_rm (rl/slime_reward.py), async, on a real controller's samples: each call
    sees slime's Sample with the prompt's ids before the response's, and every group trains."""
    from pivotflow.rl.slime_reward import SlimeSample, slime_reward

    seen: list[SlimeSample] = []

    async def rm(args: Any, sample: SlimeSample) -> float:
        seen.append(sample)
        return float(sample.label == sample.response)

    g = chain_graph(lambda g: [g.map("reward", slime_reward(rm), writes=["reward"]),
                               g.group("advantage", grpo_advantage, writes=["advantage"])],
                    judge=False)
    h = Harness(steps=2, assignments=dict(POOLS), graph=g)
    await run_to_end(h)
    assert sorted(g for r in h.records for g in r["group_ids"]) == [0, 1, 2, 3]
    assert {s.group_index for s in seen} >= {0, 1, 2, 3} and len(seen) >= 8
    for s in seen:
        assert 0 < s.response_length < len(s.tokens) and s.label is not None
        assert s.status in ("completed", "truncated") and s.rollout_log_probs


async def test_calls_left_waiting_their_turn_when_the_run_stops_are_closed() -> None:
    """A run stopped while calls wait their turn (concurrency 1, the one out hanging) closes
    the coroutines it never started: no "never awaited" warning, and a snapshot still holds
    their samples."""
    import gc
    import warnings

    async def hangs(reward: float | None, group_id: int, **_: Any) -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    h = Harness(steps=2, assignments=dict(POOLS), graph=async_graph(hangs, concurrency=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with serving(h, dict(POOLS)) as (run, _):
            while h.ctl.calls.in_flight() < 3:
                await asyncio.sleep(0.01)
            h.ctl.fail(RuntimeError("stopped"))
            with pytest.raises(RuntimeError, match="stopped"):
                await asyncio.wait_for(run, 10)
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]
    bonus = [n.name for n in h.ctl.order].index("bonus")
    assert sum(s.stage == bonus for s in snapshot(h.ctl).samples) >= 3
