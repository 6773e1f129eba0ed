"""A multi-turn stage's tools reach the policy's prompt through its chat template, as verl's
multi-turn rollouts render them (Qwen2.5's template lists them in its system message), on the
training prompts and the evaluation prompts alike; ``tools_in_prompt=False`` leaves them out;
a plain string prompt is encoded as it is."""

from __future__ import annotations

from pathlib import Path

from chat_templates import QWEN25
from hf_folders import save_tokenizer, train_bpe

from pivotflow.controller.evaluation import Evaluation
from pivotflow.graph import Graph
from pivotflow.messages import encode_prompt
from pivotflow.tasks.registry import Problem
from pivotflow.tokenizer import load_tokenizer

TOOLS = "pivotflow.tools.code_interpreter:code_interpreter,pivotflow.tools.builtin:calculator"
CHAT = [{"role": "user", "content": "What is 12 + 30?"}]


def graph(**generate: object) -> Graph:
    g = Graph("g")
    prompts = g.source("prompts", task="arithmetic", group_size=2, groups_per_step=1)
    g.chain(prompts, g.generate("rollout", model="policy", pool="rollout", **generate))
    return g


def test_the_tools_schemas_are_rendered_into_chat_prompts(tmp_path: Path) -> None:
    save_tokenizer(train_bpe(), tmp_path, chat_template=QWEN25)
    tok = load_tokenizer(tmp_path)
    tools = graph(tools=TOOLS).prompt_tools()
    assert tools is not None and [t["function"]["name"] for t in tools] == \
        ["code_interpreter", "calculator"]
    text = tok.decode(encode_prompt(tok, CHAT, tools=tools))
    assert "<tools>" in text and '"name": "code_interpreter"' in text
    assert text.endswith("What is 12 + 30?\nassistant\n")  # (special tokens not decoded)
    assert "<tools>" not in tok.decode(encode_prompt(tok, CHAT))
    # a string prompt is not templated unless the source says so: encoded as it is
    assert tok.decode(encode_prompt(tok, "12+30=", tools=tools)) == "12+30="
    # evaluation prompts are rendered the same way
    held_out = Evaluation([Problem(prompt=CHAT, answer="42")], tok, every=1, steps=1, temperature=0.0,
                          chat_template=False, seed=0, on_round=lambda _: None, tools=tools)
    assert held_out.prompt_ids == [encode_prompt(tok, CHAT, tools=tools)]


def test_tools_in_prompt_false_leaves_them_out_and_a_graph_without_tools_has_none() -> None:
    assert graph(tools=TOOLS, tools_in_prompt=False).prompt_tools() is None
    assert graph().prompt_tools() is None
