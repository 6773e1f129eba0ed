"""The Hermes/Qwen tool-call format: parse, format, and spot a call closing in a stream."""

from __future__ import annotations

import pytest
from hf_folders import save_tokenizer, train_bpe

from pivotflow.errors import ToolCallError
from pivotflow.tokenizer import Tokenizer, default_tokenizer, load_tokenizer
from pivotflow.tools import HermesParser, ToolCall, ToolCallParser, ToolCallWatcher
from pivotflow.tools.trajectory import REPLACEMENT, encode_observation, turn_text

P = HermesParser()


def test_parse_calls_in_order_with_spans() -> None:
    text = (
        'I will add. <tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n'
        '</tool_call> and <tool_call>{"name": "echo", "arguments": "{\\"text\\": \\"a\\"}"}'
        "</tool_call> done"
    )
    calls = P.parse(text)
    assert isinstance(calls, list)
    assert [(c.name, c.arguments) for c in calls] == [
        ("calculator", {"expression": "1+2"}),
        ("echo", {"text": "a"}),
    ]
    start, end = calls[0].span
    assert text[start:end].startswith("<tool_call>") and text[start:end].endswith("</tool_call>")
    assert P.parse("no calls here") == []
    assert P.parse('<tool_call>{"name": "f"}</tool_call>') == [ToolCall("f", {}, (0, 36))]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            '<tool_call>{"name": "f", "arguments": {</tool_call>',
            "malformed tool call JSON at char 0",
        ),
        ('ab<tool_call>{"name": "f"}', "'<tool_call>' at char 2 is never closed"),
        ("x</tool_call>", "'</tool_call>' at char 1 has no '<tool_call>' before it"),
        ("<tool_call>[1, 2]</tool_call>", "must be a JSON object .* got list"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'has no string "name"'),
        ('<tool_call>{"name": 3}</tool_call>', 'has no string "name"'),
        (
            '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
            '"arguments" must be a JSON object',
        ),
        (
            '<tool_call>{"name": "f", "arguments": "{oops"}</tool_call>',
            "is a string that is not JSON",
        ),
        ('<tool_call>{"name": "f"}<tool_call>{"name": "g"}</tool_call>', "is not closed before"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "malformed tool call JSON"),
    ],
)
def test_malformed_calls_are_returned_not_raised(text: str, match: str) -> None:
    result = P.parse(text)
    assert isinstance(result, ToolCallError)
    assert pytest.raises(ToolCallError, _raise, result).match(match)


def _raise(exc: Exception) -> None:
    raise exc


def test_format_round_trip() -> None:
    text = P.format_call("calculator", {"expression": "2*3"})
    assert (
        text
        == '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>'
    )
    assert P.parse(text) == [ToolCall("calculator", {"expression": "2*3"}, (0, len(text)))]
    assert HermesParser(newlines=False).format_call("f", {}) == (
        '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    )
    assert P.format_result("calculator", "6") == "<tool_response>\n6\n</tool_response>"
    assert HermesParser(result_json=True).format_result("calculator", "6") == (
        '<tool_response>\n{"name": "calculator", "content": "6"}\n</tool_response>'
    )
    assert isinstance(P, ToolCallParser)
    assert P.stop_strings == ("</tool_call>",)


def test_call_closed() -> None:
    call = P.format_call("f", {})
    assert P.call_closed(call)
    assert P.call_closed(call + "\n", new_chars=3)
    assert not P.call_closed(call + " more text", new_chars=3)  # it closed earlier, not just now
    assert not P.call_closed(call[:-1])
    assert not P.call_closed("text </tool_call>")  # a close tag with nothing open


def test_watcher_on_a_token_id_stream() -> None:
    tok = default_tokenizer()
    text = "Let me compute. " + P.format_call("calculator", {"expression": "17*23"}) + " tail"
    ids = tok.encode(text)
    watcher = ToolCallWatcher(P, tokenizer=tok)
    stops = [i for i, tid in enumerate(ids) if watcher.push([tid])]
    assert len(stops) == 1
    assert tok.decode(ids[: stops[0] + 1]).endswith("</tool_call>")
    watcher.reset()
    assert watcher.text == ""
    # a multi-character piece that holds the close tag and more still counts
    assert ToolCallWatcher(P).push_text(text)
    with pytest.raises(ToolCallError, match="needs a tokenizer"):
        ToolCallWatcher(P).push([1])


@pytest.fixture(scope="module")
def bpe_without_tags(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """A byte-level BPE where the tags are no tokens of their own (Llama 3's case)."""
    folder = tmp_path_factory.mktemp("bpe")
    save_tokenizer(train_bpe(tool_tags=False), folder)
    return load_tokenizer(folder)


def test_watcher_finds_a_close_tag_split_over_bpe_tokens(bpe_without_tags: Tokenizer) -> None:
    tok = bpe_without_tags
    call = P.format_call("calculator", {"expression": "17*23", "note": "é→ü"})
    ids = tok.encode("Let me compute: " + call + " then more")
    close = tok.encode("</tool_call>")
    assert len(close) > 1  # the tag straddles tokens
    pieces = [tok.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces)  # and so do the multi-byte characters
    watcher = ToolCallWatcher(P, tokenizer=tok)
    stops = [i for i, tid in enumerate(ids) if watcher.push([tid])]
    assert len(stops) == 1  # exactly once, at the token that completes the tag
    assert tok.decode(ids[: stops[0] + 1]).endswith("</tool_call>")
    assert not tok.decode(ids[: stops[0]]).endswith("</tool_call>")
    assert P.parse(watcher.text)[0].arguments["note"] == "é→ü"  # nothing garbled
    assert "\ufffd" not in watcher.text


def test_a_turn_decodes_after_the_trajectory_before_it(bpe_without_tags: Tokenizer) -> None:
    tok = bpe_without_tags
    ids = tok.encode("x→y")
    cut = next(i for i in range(1, len(ids)) if "\ufffd" in tok.decode(ids[:i]))
    # the arrow's first bytes ended the last turn: this turn completes it
    assert turn_text(tok, ids[:cut], ids[cut:]) == "→y"
    assert turn_text(tok, [], ids) == "x→y"
    assert turn_text(tok, [], ids[:cut]).startswith("x\ufffd")  # as decode shows it


def test_observations_are_the_model_tokenizers_ids(bpe_without_tags: Tokenizer) -> None:
    text = "\n<tool_response>\nnaïve ✓ \x00\n</tool_response>\n"
    assert encode_observation(bpe_without_tags, text) == bpe_without_tags.encode(text)
    assert bpe_without_tags.decode(encode_observation(bpe_without_tags, text)) == text
    # a fixed alphabet cannot hold every character a tool prints: those are replaced
    char = default_tokenizer()
    assert char.decode(encode_observation(char, text)) == text.replace("ï", REPLACEMENT) \
        .replace("✓", REPLACEMENT).replace("\x00", REPLACEMENT)


def test_python_blocks_are_calls_of_the_code_interpreter() -> None:
    """Qwen2.5-Math's and ToRL's tool-integrated format: a ```python block, then ```output,
    where generation stops; the observation closes the fence."""
    from pivotflow.tools.parsers import PythonBlockParser
    from pivotflow.tools.pool import ToolResult
    from pivotflow.tools.trajectory import observation_text

    parser = PythonBlockParser()
    turn = "First compute it.\n```python\nx = 2 ** 10\nprint(x)\n```\n```output"
    assert parser.stop_strings == ("```output",)
    assert parser.parse(turn) == [ToolCall("code_interpreter", {"code": "x = 2 ** 10\nprint(x)"},
                                           (18, len(turn)))]
    assert parser.call_closed(turn) and parser.call_closed(turn, new_chars=4)
    assert not parser.call_closed(turn + " more") and parser.parse("no code here") == []
    assert not parser.call_closed("```output")  # no block before it: not a call
    assert str(parser.parse("```output")) == "'```output' at char 0 has no '```python' block " \
        "before it"
    assert "is not closed" in str(parser.parse("```python\nx = 1\n```output"))
    assert observation_text(parser, [ToolResult("1024\n", name="code_interpreter")]) == \
        "\n1024\n```\n"
    assert parser.format_call("code_interpreter", {"code": "print(1)"}) == \
        "```python\nprint(1)\n```\n```output"


def test_python_block_needs_the_code_interpreter_in_the_tools() -> None:
    from pivotflow.errors import GraphError
    from pivotflow.graph import Graph

    g = Graph("g")
    with pytest.raises(GraphError, match="tool_parser 'python_block' calls the "
                                         "code_interpreter tool; add pivotflow.tools"):
        g.generate("rollout", model="policy", pool="rollout", tool_parser="python_block",
                   tools="pivotflow.tools.builtin:calculator")
