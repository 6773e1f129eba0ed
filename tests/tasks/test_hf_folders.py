"""The shipped built-in models are ordinary Hugging Face folders: transformers loads them and
agrees with pivotflow on every token and logit, and the tokenizer rebuilds byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pivotflow.engines.torch.weights import build_model, load_checkpoint
from pivotflow.tasks.bpe import SPECIAL, TOOL_TAGS
from pivotflow.tasks.cache import FILES, shipped_dir
from pivotflow.tasks.tool_policy_cache import shipped_tool_policy
from pivotflow.tokenizer import load_tokenizer
from pivotflow.tokenizer.base import Tokenizer
from pivotflow.tools.builtin import calculator

FOLDERS = {
    "policy": shipped_dir(0) / "policy",
    "judge": shipped_dir(0) / "judge",
    "tool_policy": shipped_tool_policy(0),
}
TEXTS = [
    "47+38=",
    "47+38=84?85:No",
    '47+38=<tool_call>\n{"name": "calculator", "arguments": {"expression": "47+38"}}\n'
    "</tool_call>\n<tool_response>\n85\n</tool_response>\n85",
    "caf\u00e9 \u2603 <|im_start|>user\n9*9=<|im_end|>",
]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja")


@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_transformers_loads_the_model_and_agrees_on_logits(name: str) -> None:
    transformers = pytest.importorskip("transformers")
    folder = FOLDERS[name]
    assert {p.name for p in folder.iterdir()} >= set(FILES)
    config, tensors = load_checkpoint(folder)
    assert config.head_dim >= 32  # vLLM's CPU backend runs no narrower heads
    ours = build_model(config, tensors, "cpu", torch.float32)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = load_tokenizer(folder)
    ids = torch.tensor([tok.encode(TEXTS[2])])
    with torch.no_grad():
        expected = theirs(ids).logits
        got = ours(ids)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tok.eos_id == theirs.generation_config.eos_token_id


@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_transformers_loads_the_tokenizer_and_agrees(name: str) -> None:
    transformers = pytest.importorskip("transformers")
    folder = FOLDERS[name]
    ours, theirs = load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)
    assert len(theirs) == ours.vocab_size == config_vocab(folder)
    assert theirs.eos_token == theirs.pad_token == "<|endoftext|>" and theirs.bos_token is None
    for text in TEXTS:
        ids = ours.encode(text, add_special_tokens=True)
        assert theirs(text)["input_ids"] == ids
        assert theirs.decode(ids, skip_special_tokens=True) == ours.decode(ids)
    messages = [
        {"role": "user", "content": "47+38="},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "calculator", "arguments": {"expression": "47+38"}}}]},
        {"role": "tool", "content": "85"},
        {"role": "assistant", "content": "85"},
    ]
    for tools in (None, [calculator.schema()]):
        assert ours.apply_chat_template(messages, tools=tools) == theirs.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True)


def config_vocab(folder: Path) -> int:
    return int(json.loads((folder / "config.json").read_text())["vocab_size"])


def test_tokenizer_layout(bpe: Tokenizer) -> None:
    """Digits one by one, the ChatML specials dropped from decoded text, the tool tags one token
    each and kept (not special, as in Qwen2.5), eos = pad, no BOS."""
    assert bpe.encode("12345") == [bpe.encode(d)[0] for d in "12345"]
    assert [bpe.encode(t) for t in (*SPECIAL, *TOOL_TAGS)] == [[i] for i in range(5)]
    assert bpe.eos_ids == (0,) and bpe.pad_id == 0 and bpe.bos_id is None
    assert bpe.special_ids == frozenset({0, 1, 2})
    call = bpe.encode("<tool_call>\n{}\n</tool_call><|im_end|>")
    assert bpe.decode(call) == "<tool_call>\n{}\n</tool_call>"
    assert 300 <= bpe.vocab_size <= 600
    assert len(bpe.encode('{"name": "calculator", "arguments": {"expression": "')) == 13


def test_the_shipped_tokenizer_rebuilds_byte_for_byte(bpe: Tokenizer, tmp_path: Path) -> None:
    bpe.save(tmp_path)
    for folder in FOLDERS.values():
        for name in TOKENIZER_FILES:
            if name == "tokenizer_config.json":  # a loaded tokenizer may order the keys anew
                assert json.loads((folder / name).read_text()) == json.loads(
                    (tmp_path / name).read_text())
            else:
                assert (folder / name).read_bytes() == (tmp_path / name).read_bytes(), name
