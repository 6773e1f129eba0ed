"""The controller on a real (byte-level BPE) tokenizer: chat-templated prompts and judge
messages, the model's stop tokens, and tool calls whose tags and characters straddle tokens."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import Harness
from hf_folders import CHATML, IM_END, save_tokenizer, train_bpe

from pivotflow.graph import Graph
from pivotflow.protocol import GenerateJob, JobDone, Jobs, JobsDone, TrainDone, TrainStep
from pivotflow.rl.group_fns import grpo_advantage
from pivotflow.tokenizer import Tokenizer, load_tokenizer
from pivotflow.tools import ToolPool
from pivotflow.verdicts import parse_yes_no

pytestmark = pytest.mark.timeout(90)
sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))  # pool_sample_tools


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """A BPE whose tool tags are several tokens each, with a ChatML template, and a
    generation_config that adds ``<|im_end|>`` to the stop tokens (as Qwen's instruct models
    do)."""
    folder = tmp_path_factory.mktemp("bpe")
    raw = train_bpe(tool_tags=False)
    save_tokenizer(raw, folder, chat_template=CHATML)
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [0, raw.token_to_id(IM_END)]}))
    return load_tokenizer(folder)


def judge_messages(prompt: str, response: str, **_: Any) -> list[dict[str, str]]:
    return [{"role": "system", "content": "Answer Yes or No."},
            {"role": "user", "content": f"Is {prompt}{response} right?"}]


def chat_graph(**generate: Any) -> Graph:
    g = Graph("chat")
    g.model("policy", source="unused")
    g.model("judge", source="unused")
    for pool in ("rollout", "genrm", "trainer"):
        g.pool(pool, workers=1)
    src = g.source("prompts", task="arithmetic", group_size=2, groups_per_step=2,
                   chat_template=True)
    gen = g.generate("rollout", model="policy", pool="rollout", **{"max_tokens": 64, **generate})
    jud = g.judge("genrm", model="judge", pool="genrm", template=judge_messages,
                  parse=parse_yes_no, max_tokens=8)
    g.chain(src, gen, jud, g.group("advantage", grpo_advantage, writes=["advantage"]),
            g.train("train", model="policy", pool="trainer"))
    return g


def result(job: GenerateJob, ids: list[int], stop: bool = True) -> JobDone:
    return JobDone(job_id=job.job_id, token_ids=ids, logprobs=[-0.5] * len(ids),
                   versions=[0] * len(ids), finish_reason="stop" if stop else "length")


async def play(h: Harness, rollout: Callable[[GenerateJob], JobDone],
               judge: Callable[[GenerateJob], JobDone]) -> list[TrainStep]:
    """Serve the harness's three workers until the run ends; returns the train steps."""
    steps: list[TrainStep] = []

    async def serve(wid: str) -> None:
        end = h.ends[wid]
        while True:
            msg = await end.recv()
            if isinstance(msg, Jobs):
                fn = rollout if wid == "w-roll" else judge
                end.send(JobsDone(results=[fn(j) for j in msg.jobs]))
            elif isinstance(msg, TrainStep):
                steps.append(msg)
                end.send(TrainDone(step=msg.step, version=msg.step + 1, stats={}, job_ids=[]))

    run = asyncio.ensure_future(h.ctl.run())
    await h.join_all()
    servers = [asyncio.ensure_future(serve(w)) for w in h.ends]
    try:
        await asyncio.wait_for(run, 60)
    finally:
        for s in servers:
            s.cancel()
        await asyncio.gather(*servers, return_exceptions=True)
    return steps


async def test_prompts_and_judge_messages_are_rendered_with_the_chat_template(
        bpe: Tokenizer) -> None:
    stops, judged = [], []

    def rollout(job: GenerateJob) -> JobDone:
        stops.append(job.stop_token_ids)
        text = bpe.decode(job.prompt_ids, skip_special=False)
        question = text.split("user\n")[1].split(IM_END)[0]
        assert text == f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        assert job.prompt_ids == bpe.encode(bpe.apply_chat_template(
            [{"role": "user", "content": question}]))
        return result(job, bpe.encode("42") + [bpe.token_id(IM_END)])  # type: ignore[attr-defined]

    def judge(job: GenerateJob) -> JobDone:
        stops.append(job.stop_token_ids)
        judged.append(bpe.decode(job.prompt_ids, skip_special=False))
        return result(job, bpe.encode("Let me see: yes") + [0])

    h = Harness(steps=2, graph=chat_graph(), tok=bpe)
    steps = await play(h, rollout, judge)
    assert stops and all(s == [0, bpe.token_id(IM_END)] for s in stops)  # type: ignore[attr-defined]
    assert list(bpe.eos_ids) == stops[0]  # eos, then generation_config's
    assert judged[0].startswith("<|im_start|>system\nAnswer Yes or No.<|im_end|>\n"
                                "<|im_start|>user\nIs ")
    assert judged[0].endswith("42 right?<|im_end|>\n<|im_start|>assistant\n")
    # the response is the decoded text without the stop token; the verdict parsed to 1.0
    rec = h.records[-1]
    assert rec["reward_mean"] == 1.0 and h.ctl.ledger.judge_failures == 0
    assert sum(len(s.seqs) for s in steps) == 8


async def test_a_judge_template_returning_bad_messages_stops_the_run_naming_the_judge(
        bpe: Tokenizer) -> None:
    def bad(**_: Any) -> list[dict[str, Any]]:
        return [{"role": "user"}]

    g = chat_graph()
    g.nodes["genrm"].options["template"] = bad
    h = Harness(steps=1, graph=g, tok=bpe)
    with pytest.raises(Exception, match=r"judge 'genrm' at .*: template returned list, expected a "
                                        r"str or a list of chat messages \(message 0 needs a "
                                        r"string 'content' \(missing\)\)"):
        await play(h, lambda j: result(j, bpe.encode("1") + [0]),
                   lambda j: result(j, bpe.encode("yes") + [0]))


def call(expression: str) -> str:
    body = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"<tool_call>\n{body}\n</tool_call>"


async def test_tool_turns_on_bpe_tokens_stay_token_in_token_out(bpe: Tokenizer) -> None:
    """A call whose close tag is several tokens, text with multi-byte characters: the call is
    found, its observation is the model tokenizer's ids, the trained trajectory is exactly the
    ids exchanged, masked by who wrote them."""
    g = chat_graph(tools=["pivotflow.tools.builtin:calculator"], max_turns=3,
                   tool_pool={"workers": 2, "timeout_s": 2.0})
    pool = ToolPool(g.nodes["rollout"].options["tools"], workers=2, timeout_s=2.0)
    turns: dict[int, list[list[int]]] = {}  # sample seed -> the ids of each of its turns

    def rollout(job: GenerateJob) -> JobDone:
        assert job.stop_strings == ["</tool_call>"]
        mine = turns.setdefault(job.seed, [])
        # a call after multi-byte characters, then (after the observation) the answer and EOS
        ids = bpe.encode("Café → " + call("6*7")) if not mine else bpe.encode("ça fait 42") + [0]
        mine.append(ids)
        return result(job, ids)

    h = Harness(steps=1, graph=g, tok=bpe, tool_pools={"rollout": pool})
    try:
        steps = await play(h, rollout, lambda j: result(j, bpe.encode("No") + [0]))
    finally:
        pool.close()
    obs = bpe.encode("\n<tool_response>\n42\n</tool_response>\n")
    assert len(bpe.encode("</tool_call>")) > 1
    (step,) = steps
    assert len(step.seqs) == 4
    for seq in step.seqs:
        first, second = next(t for t in turns.values() if t[0] == list(seq.response_ids[
            :len(t[0])]))
        assert list(seq.response_ids) == first + obs + second
        assert list(seq.loss_mask) == [1] * len(first) + [0] * len(obs) + [1] * len(second)
        assert bpe.decode(seq.response_ids) == "Café → " + call("6*7") + \
            "\n<tool_response>\n42\n</tool_response>\nça fait 42"
    rec = h.records[-1]
    assert rec["tool_calls_per_sample"] == 1.0 and rec["tool_errors"] == 0
