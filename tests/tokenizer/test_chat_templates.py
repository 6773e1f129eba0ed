"""Chat templates render exactly as transformers' apply_chat_template(tokenize=False)."""

from __future__ import annotations

from typing import Any

import pytest
from chat_templates import EXTENSIONS, LLAMA3, QWEN3, QWEN25
from tok_fixtures import Saver
from transformers import AutoTokenizer

from pivotflow.errors import TokenizerError
from pivotflow.tokenizer import load_tokenizer

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluates <arithmetic> & returns 'the' value: ×÷",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}]

CALL = {"type": "function", "function": {"name": "calculator",
                                          "arguments": {"expression": "(3 + 4) * 5"}}}

CHATS: dict[str, list[dict[str, Any]]] = {
    "user": [{"role": "user", "content": "What is 12 + 30?"}],
    "system": [{"role": "system", "content": "You are terse. 简洁。"},
               {"role": "user", "content": "Hi 🎉"}],
    "tools": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "What is (3 + 4) * 5?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "35", "name": None},
        {"role": "assistant", "content": "It is 35.", "reasoning_content": "3+4=7, 7*5=35"},
        {"role": "user", "content": "And <b>doubled</b>?"},
    ],
    "thinking": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "6", "reasoning": "add again"},
    ],
}


def _pair(save_hf: Saver, template: str, **kwargs: Any) -> tuple[Any, Any]:
    folder = save_hf(chat_template=template, **kwargs)
    return load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)


def _same(ours: Any, ref: Any, chat: list[dict[str, Any]], **kw: Any) -> str:
    for gen in (True, False):
        want = ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen, **kw)
        got = ours.apply_chat_template(chat, add_generation_prompt=gen, **kw)
        assert got == want
    return got


@pytest.mark.parametrize("chat", sorted(CHATS))
def test_qwen25_chatml_with_tools(save_hf: Saver, chat: str) -> None:
    ours, ref = _pair(save_hf, QWEN25, pad_token="<|endoftext|>")
    _same(ours, ref, CHATS[chat])
    text = _same(ours, ref, CHATS[chat], tools=TOOLS)
    assert '"description": "Evaluates <arithmetic> & returns \'the\' value: ×÷"' in text


@pytest.mark.parametrize("chat", ["user", "system"])
def test_llama3_with_bos_token_and_date(save_hf: Saver, chat: str) -> None:
    ours, ref = _pair(save_hf, LLAMA3, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    text = _same(ours, ref, CHATS[chat])
    assert text.startswith("<|begin_of_text|><|start_header_id|>system")
    _same(ours, ref, CHATS[chat], tools=TOOLS)
    _same(ours, ref, CHATS[chat], date_string="01 Jan 2030")


def test_llama3_raise_exception_is_a_one_line_error(save_hf: Saver) -> None:
    ours, ref = _pair(save_hf, LLAMA3, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    two_calls = [{"role": "user", "content": "x"},
                 {"role": "assistant", "tool_calls": [CALL, CALL]}]
    with pytest.raises(Exception, match="single tool-calls"):
        ref.apply_chat_template(two_calls, tokenize=False)
    with pytest.raises(TokenizerError, match="single tool-calls at once") as err:
        ours.apply_chat_template(two_calls)
    assert "\n" not in str(err.value) and "chat_template.jinja" in str(err.value)


@pytest.mark.parametrize("chat", sorted(CHATS))
def test_qwen3_enable_thinking(save_hf: Saver, chat: str) -> None:
    ours, ref = _pair(save_hf, QWEN3)
    for kw in ({}, {"enable_thinking": False}, {"enable_thinking": True}):
        _same(ours, ref, CHATS[chat], **kw)
        _same(ours, ref, CHATS[chat], tools=TOOLS, **kw)
    off = ours.apply_chat_template(CHATS["user"], enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_every_template_extension(save_hf: Saver) -> None:
    ours, ref = _pair(save_hf, EXTENSIONS)
    docs = [{"title": "A", "text": "alpha"}, {"title": "B", "text": "βeta"}]
    for chat in CHATS.values():
        _same(ours, ref, chat)
        _same(ours, ref, chat, tools=TOOLS, documents=docs, max_turns=2)


def test_named_templates_choose_default_and_tool_use(save_hf: Saver) -> None:
    import json

    folder = save_hf()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": "D{{ messages[0].content }}"},
                               {"name": "tool_use", "template": "T{{ tools | length }}"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    ours, ref = load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)
    chat = CHATS["user"]
    assert ours.chat_template == "D{{ messages[0].content }}"
    _same(ours, ref, chat)
    _same(ours, ref, chat, tools=TOOLS)
    assert ours.apply_chat_template(chat, tools=TOOLS) == "T1"


def test_no_template_and_char_tokenizer_errors(save_hf: Saver, tmp_path: Any) -> None:
    from pivotflow.tokenizer import default_tokenizer

    tok = load_tokenizer(save_hf())
    assert tok.chat_template is None
    with pytest.raises(TokenizerError, match="has no chat template"):
        tok.apply_chat_template(CHATS["user"])
    with pytest.raises(TokenizerError, match="char tokenizer .* has no chat template"):
        default_tokenizer().apply_chat_template(CHATS["user"])
    ours = load_tokenizer(save_hf("t2", chat_template=QWEN25))
    with pytest.raises(TokenizerError, match="empty list of messages"):
        ours.apply_chat_template([])
    with pytest.raises(TokenizerError, match="chat message 0 must be a dict"):
        ours.apply_chat_template(["hello"])
