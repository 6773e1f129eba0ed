"""Multi-turn rollouts through the real controller and a real tool pool: every bad call becomes
an observation the policy reads in its next turn, with a counter; the run goes on."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from harness import TOK, Harness, expected_tokens, make_graph, serving, template

from pivotflow.graph import Graph
from pivotflow.protocol import JobDone, Jobs, JobsDone, TrainDone, TrainStep
from pivotflow.tools import ToolPool

pytestmark = pytest.mark.timeout(90)
sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))  # pool_sample_tools, for the pool

TOOLS = ["pivotflow.tools.builtin:calculator", "pool_sample_tools"]
POOL = {"workers": 3, "timeout_s": 1.0, "cpu_s": 0.25, "memory_mb": 64,
        "max_argument_chars": 1000, "max_output_chars": 200}


def call(name: str, arguments: Any) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


# first turn of each sample -> (what its observation must say, the pool's counter kind)
CASES = {
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": }\n</tool_call>':
        ("could not read the tool call: malformed tool call JSON", "parse"),
    call("search", {"q": "x"}): ("unknown tool 'search'", "unknown_tool"),
    call("calculator", {"expression": 12}): ("expression", "arguments"),
    call("echo", {"text": "x" * 1500}): ("the cap is 1000", "too_large"),
    call("boom", {"message": "kaput"}): ("kaput", "error"),
    call("sleeper", {"seconds": 60}): ("timed out after 1 s", "timeout"),
    call("spin", {}): ("CPU-time limit", "cpu"),
    call("fork_bomb", {"forks": 50}): ("os.fork", "fork"),
    call("hog", {}): ("ran out of memory", "memory"),
    call("connect", {}): ("no network access", "network"),
    call("calculator", {"expression": "6*7"}): ("\n42\n", "ok"),
}


def tool_graph(group_size: int, max_turns: int = 3, groups_per_step: int = 1,
               max_total_tokens: int | None = None) -> Graph:
    return make_graph(group_size, groups_per_step, judge_template=judge_whole, max_tokens=4000,
                      tools=TOOLS, max_turns=max_turns, tool_pool=POOL,
                      max_total_tokens=max_total_tokens)


def judge_whole(prompt: str, trajectory: str, **_: Any) -> str:
    """A GenRM that reads the whole trajectory: calls and tool results included."""
    return template(prompt, trajectory.replace("\n", " "))


def finished(job_id: int, text: str, eos: bool) -> JobDone:
    ids = TOK.encode(text) + ([TOK.eos_id] if eos else [])
    return JobDone(job_id=job_id, token_ids=ids, logprobs=[-0.25] * len(ids),
                   versions=[0] * len(ids), finish_reason="stop")


async def play(graph: Graph, rollout: Any,
               judged: list[str] | None = None) -> tuple[Harness, list[TrainStep], ToolPool]:
    """Run ``graph`` for one step with a real tool pool, answering rollout jobs with
    ``rollout(job)`` and judge jobs with "Y" (their prompts go to ``judged``)."""
    pool = ToolPool(graph.nodes["rollout"].options["tools"], **POOL)
    h = Harness(steps=1, graph=graph, tool_pools={"rollout": pool})
    steps: list[TrainStep] = []

    async def serve(wid: str) -> None:
        end = h.ends[wid]
        while True:
            msg = await end.recv()
            if isinstance(msg, Jobs):
                if wid == "w-judge" and judged is not None:
                    judged.extend(TOK.decode(j.prompt_ids) for j in msg.jobs)
                fn = rollout if wid == "w-roll" else (lambda j: finished(j.job_id, "Y", True))
                end.send(JobsDone(results=[fn(j) for j in msg.jobs]))
            elif isinstance(msg, TrainStep):
                steps.append(msg)
                end.send(TrainDone(step=msg.step, version=1, stats={}, job_ids=[]))

    run = asyncio.ensure_future(h.ctl.run())
    await h.join_all()
    servers = [asyncio.ensure_future(serve(w)) for w in h.ends]
    try:
        await asyncio.wait_for(run, 60)
    finally:
        for s in servers:
            s.cancel()
        pool.close()
    return h, steps, pool


async def test_every_bad_call_is_an_observation_and_the_run_goes_on() -> None:
    turns = list(CASES)
    first_turn: dict[int, str] = {}  # sample (by its seed) -> its first turn's text
    seen: dict[str, str] = {}  # first turn -> the prompt of the second turn
    judged: list[str] = []

    def answer(job: Any) -> JobDone:
        text = TOK.decode(job.prompt_ids)
        assert job.stop_strings == ["</tool_call>"]
        if "<tool_response>" not in text:  # the first turn: one bad (or good) call each
            first_turn[job.seed] = turns[len(first_turn)]
            return finished(job.job_id, first_turn[job.seed], eos=False)
        seen[first_turn[job.seed]] = text
        return finished(job.job_id, "7", eos=True)

    h, steps, pool = await play(tool_graph(group_size=len(turns)), answer, judged)
    # the policy's next turn read each observation, failures as "Error: ..." text
    for turn, (says, kind) in CASES.items():
        obs = seen[turn].split("</tool_call>", 1)[1]
        assert obs.startswith("\n<tool_response>\n") and says in obs, (kind, obs)
        assert obs.startswith("\n<tool_response>\nError: ") == (kind != "ok"), obs
        assert pool.counters[kind] >= 1, kind
    # trained trajectories: policy tokens in the mask, prompt and tool tokens out of it
    (step,) = steps
    for seq in step.seqs:
        text = TOK.decode(seq.response_ids)
        turn, rest = text.split("</tool_call>", 1)
        turn += "</tool_call>"
        obs = rest[: rest.index("</tool_response>\n") + len("</tool_response>\n")]
        n_turn, n_obs = len(TOK.encode(turn)), len(TOK.encode(obs))
        assert seq.loss_mask == [1] * n_turn + [0] * n_obs + [1, 1]  # "7" and EOS
        assert seq.logprobs[n_turn:n_turn + n_obs] == [0.0] * n_obs
        assert len(seq.versions) == len(seq.response_ids) == len(seq.loss_mask)
    # the judge read whole trajectories (its template asked for ``trajectory``)
    assert len(judged) == len(CASES)
    assert all("</tool_call> <tool_response> " in j and j.endswith("7?") for j in judged)
    (rec,) = h.records
    assert rec["tool_calls_per_sample"] == 1.0 and rec["turns_mean"] == 2.0
    assert rec["tool_errors"] == len(CASES) - 1
    assert h.ctl.ledger.samples_trained == len(CASES)


async def run_calling(loop_call: str, **graph_kw: Any) -> tuple[Harness, list[TrainStep]]:
    """A policy that calls ``loop_call`` in every turn, to the end of the run."""
    h, steps, _ = await play(tool_graph(group_size=2, **graph_kw),
                             lambda j: finished(j.job_id, loop_call, eos=False))
    return h, steps


async def test_max_turns_ends_a_trajectory_that_keeps_calling() -> None:
    loop_call = call("calculator", {"expression": "1+1"})
    h, steps = await run_calling(loop_call, max_turns=2)
    (rec,) = h.records
    assert rec["turns_mean"] == 2.0 and rec["tool_calls_per_sample"] == 1.0
    for seq in steps[0].seqs:  # call, its result, call again: the last turn is not run
        assert TOK.decode(seq.response_ids) == loop_call + "\n<tool_response>\n2\n" \
            "</tool_response>\n" + loop_call


async def test_an_observation_past_the_token_budget_ends_the_trajectory_at_its_call() -> None:
    big = call("echo", {"text": "y" * 150})
    h, steps = await run_calling(big, max_total_tokens=len(big) + 100)
    (rec,) = h.records
    assert rec["turns_mean"] == 1.0 and rec["tool_calls_per_sample"] == 1.0
    assert h.ctl.errors["generation"] == 0  # no turn was sent that could not fit
    for seq in steps[0].seqs:  # the call, trained; the observation that did not fit, dropped
        assert TOK.decode(seq.response_ids) == big and seq.loss_mask == [1] * len(big)


def value_of(question: str) -> str:
    a, b = question.rstrip("=").split("+")
    return str(int(a) + int(b))


def agent_tokens(prompt_ids: list[int], model: str) -> list[int]:
    """What a TokenWorker playing a tool-using policy generates: a calculator call for the
    question, then (after the observation) the value it read, then EOS."""
    if model != "policy":
        return expected_tokens(prompt_ids, model)
    text = TOK.decode(prompt_ids)
    if "<tool_response>" not in text:
        return TOK.encode(call("calculator", {"expression": text.rstrip("=")}))
    return TOK.encode(text.split("<tool_response>\n")[1].split("\n")[0]) + [TOK.eos_id]


@pytest.mark.parametrize("seed", [0, 1])
async def test_trajectories_migrate_mid_turn_and_between_turns_intact(seed: int) -> None:
    import random

    pools = {"w-r0": "rollout", "w-r1": "rollout", "w-j0": "genrm", "w-t": "trainer"}
    graph = tool_graph(group_size=4, groups_per_step=3)
    pool = ToolPool(graph.nodes["rollout"].options["tools"], **POOL)
    h = Harness(steps=4, graph=graph, tool_pools={"rollout": pool}, assignments=dict(pools))
    h.expect = agent_tokens
    rng = random.Random(seed)
    try:
        async with serving(h, pools) as (run, workers):
            while not run.done():
                await asyncio.sleep(rng.uniform(0.001, 0.01))
                wid = rng.choice(list(pools))
                w = h.ctl.workers[wid]
                if w.state == "ready" and not w.training:
                    to = rng.choice([p for p in ("rollout", "genrm", "trainer") if p != w.pool])
                    h.ctl.shifts.shift(wid, to, reason="test")
            await asyncio.wait_for(run, 30)
    finally:
        pool.close()
    assert h.ctl.shifts.migrations > 0 and h.ctl.lost_groups() == []
    assert h.ctl.ledger.groups_trained == 12 and h.ctl.ledger.duplicates == 0
    policy_tokens = 0
    for step in h.train_steps:
        for seq in step.seqs:
            question = TOK.decode(seq.prompt_ids)
            value = value_of(question)
            turn1 = call("calculator", {"expression": question.rstrip("=")})
            obs = f"\n<tool_response>\n{value}\n</tool_response>\n"
            assert TOK.decode(seq.response_ids) == turn1 + obs + value
            n1, n_obs, n2 = len(turn1), len(obs), len(value) + 1  # + EOS
            assert seq.loss_mask == [1] * n1 + [0] * n_obs + [1] * n2
            # logprobs made before a migration are kept: the generator's are -0.1 * position
            assert seq.logprobs == pytest.approx(
                [-0.1 * (i + 1) for i in range(n1)] + [0.0] * n_obs
                + [-0.1 * (i + 1) for i in range(n2)])
            assert len(seq.versions) == len(seq.response_ids)
            policy_tokens += sum(seq.loss_mask)
    # no policy token was sampled twice: migrated turns resumed from their prefixes
    assert sum(w.policy_tokens for w in workers) == policy_tokens


def sleepy_agent(prompt_ids: list[int], model: str) -> list[int]:
    """A policy whose call takes 0.3 s (so samples wait in the tool pool), then copies it."""
    if model != "policy":
        return expected_tokens(prompt_ids, model)
    if "<tool_response>" not in TOK.decode(prompt_ids):
        return TOK.encode(call("sleeper", {"seconds": 0.3}))
    return TOK.encode("woke") + [TOK.eos_id]


async def test_a_checkpoint_taken_while_calls_run_resumes_them() -> None:
    import msgspec

    from pivotflow.controller.snapshot import ControllerState, restore, snapshot
    from pivotflow.controller.turns import AWAITING

    pools = {"w-r0": "rollout", "w-j0": "genrm", "w-t": "trainer"}
    graph = tool_graph(group_size=2, groups_per_step=2)
    tool_pool = ToolPool(graph.nodes["rollout"].options["tools"], **POOL)

    def harness() -> Harness:
        h = Harness(steps=3, graph=graph, tool_pools={"rollout": tool_pool},
                    assignments=dict(pools), max_staleness=1)
        h.expect = sleepy_agent
        return h

    first, taken = harness(), []

    def write() -> None:
        raw = msgspec.msgpack.encode(snapshot(first.ctl))  # as a checkpoint file carries it
        taken.append(msgspec.msgpack.decode(raw, type=ControllerState))
        first.ctl.fail(RuntimeError("stopped"))

    try:
        async with serving(first, pools) as (run, _):
            while not first.ctl.tools.waiting:
                await asyncio.sleep(0.001)
            first.ctl.collector.collect(write)
            with pytest.raises(RuntimeError, match="stopped"):
                await asyncio.wait_for(run, 30)
        (state,) = taken
        assert any(s.fields.get(AWAITING) for s in state.samples)
        second = harness()
        restore(second.ctl, state)
        assert second.ctl.tools.waiting  # their calls run again once the run starts
        async with serving(second, pools) as (run, _):
            await asyncio.wait_for(run, 30)
    finally:
        tool_pool.close()
    groups = [g for h in (first, second) for r in h.records for g in r["group_ids"]]
    assert sorted(groups) == list(range(6))
    for step in second.train_steps:
        for seq in step.seqs:
            text = TOK.decode(seq.response_ids)
            assert text == call("sleeper", {"seconds": 0.3}) + \
                "\n<tool_response>\nwoke\n</tool_response>\nwoke"
            assert sum(seq.loss_mask) == len(call("sleeper", {"seconds": 0.3})) + 5


def coding_agent(prompt_ids: list[int], model: str) -> list[int]:
    """A tool-integrated reasoner: it writes a program for the question, runs it with the code
    interpreter, and answers what the program printed."""
    if model != "policy":
        return expected_tokens(prompt_ids, model)
    text = TOK.decode(prompt_ids)
    if "<tool_response>" not in text:
        a, b = text.rstrip("=").split("+")
        return TOK.encode(call("code_interpreter", {"code": f"a = {a}\nb = {b}\nprint(a + b)"}))
    return TOK.encode(text.split("<tool_response>\n")[1].split("\n")[0]) + [TOK.eos_id]


async def run_with_the_code_interpreter(agent: Any, steps: int,
                                        tool_parser: str = "hermes") -> tuple[Harness, ToolPool]:
    """``steps`` steps of a graph whose rollout has the code interpreter, the policy played by
    ``agent``: the harness and the tool pool, after the run."""
    pools = {"w-r0": "rollout", "w-j0": "genrm", "w-t": "trainer"}
    graph = make_graph(2, 2, judge_template=judge_whole, max_tokens=4000,
                       tools=["pivotflow.tools.code_interpreter:code_interpreter"], max_turns=2,
                       tool_parser=tool_parser,
                       tool_pool={"workers": 2, "timeout_s": 5.0, "memory_mb": 256})
    tool_pool = ToolPool(graph.nodes["rollout"].options["tools"], workers=2, timeout_s=5.0,
                         memory_mb=256)
    h = Harness(steps=steps, graph=graph, tool_pools={"rollout": tool_pool},
                assignments=dict(pools))
    h.expect = agent
    try:
        async with serving(h, pools) as (run, _):
            await asyncio.wait_for(run, 60)
    finally:
        tool_pool.close()
    return h, tool_pool


async def test_a_policy_that_writes_code_reads_what_it_printed() -> None:
    """The code interpreter in a run's turns: every program ran in the code sandbox, each
    sample's next turn read its output, and the trained sequence holds the program's real
    output, masked out of the loss."""
    h, tool_pool = await run_with_the_code_interpreter(coding_agent, steps=2)
    assert tool_pool.pids() == [] and tool_pool.counters == {"ok": 8}
    for step in h.train_steps:
        for seq in step.seqs:
            question = TOK.decode(seq.prompt_ids)
            a, b = question.rstrip("=").split("+")
            value = value_of(question)
            turn1 = call("code_interpreter", {"code": f"a = {a}\nb = {b}\nprint(a + b)"})
            obs = f"\n<tool_response>\n{value}\n\n</tool_response>\n"
            assert TOK.decode(seq.response_ids) == turn1 + obs + value
            assert seq.loss_mask == [1] * len(turn1) + [0] * len(obs) + [1] * (len(value) + 1)
    assert [r["tool_calls_per_sample"] for r in h.records] == [1.0, 1.0]


def python_block_agent(prompt_ids: list[int], model: str) -> list[int]:
    """A reasoner in Qwen2.5-Math's tool-integrated format: a ```python block, ```output (where
    generation stops), then, after the output, the answer."""
    if model != "policy":
        return expected_tokens(prompt_ids, model)
    text = TOK.decode(prompt_ids)
    if "```output" not in text:
        a, b = text.rstrip("=").split("+")
        return TOK.encode(f"```python\nprint({a} + {b})\n```\n```output")
    return TOK.encode(text.split("```output\n")[1].split("\n")[0]) + [TOK.eos_id]


async def test_python_blocks_run_as_calls_and_their_output_closes_the_fence() -> None:
    h, tool_pool = await run_with_the_code_interpreter(python_block_agent, steps=1,
                                                       tool_parser="python_block")
    assert tool_pool.counters == {"ok": 4}
    for seq in h.train_steps[0].seqs:
        question = TOK.decode(seq.prompt_ids)
        a, b = question.rstrip("=").split("+")
        value = value_of(question)
        turn1 = f"```python\nprint({a} + {b})\n```\n```output"
        obs = f"\n{value}\n```\n"
        assert TOK.decode(seq.response_ids) == turn1 + obs + value
        assert seq.loss_mask == [1] * len(turn1) + [0] * len(obs) + [1] * (len(value) + 1)
