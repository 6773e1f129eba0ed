"""Each bad tokenizer folder is a one-line TokenizerError naming the file (and the key), with
none of the file's content in it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from tok_fixtures import Saver

from pivotflow.errors import TokenizerError
from pivotflow.tokenizer import CharTokenizer, load_tokenizer


def _edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _set(key: str, value: object) -> Callable[[dict], None]:
    return lambda d: d.__setitem__(key, value)


def _bad_folders(folder: Path) -> dict[str, tuple[Callable[[], None], str]]:
    """case -> (how to break the folder, the file and key the message must name)."""
    tok, cfg = folder / "tokenizer.json", folder / "tokenizer_config.json"
    gen, jinja = folder / "generation_config.json", folder / "chat_template.jinja"
    return {
        "missing tokenizer.json": (tok.unlink, "tokenizer.json: missing"),
        "tokenizer.json not JSON": (lambda: tok.write_text(tok.read_text()[:-40]),
                                    "tokenizer.json: not valid JSON (line"),
        "tokenizer.json not a tokenizer": (
            lambda: _edit_json(tok, lambda d: d.__setitem__("model", {"type": "Nope"})),
            "tokenizer.json: not a tokenizers serialization"),
        "bad char description": (lambda: tok.write_text(json.dumps({"type": "char", "chars": 5})),
                                 "tokenizer.json: key 'chars'"),
        "config not JSON": (lambda: cfg.write_text("{\"eos_token\": "),
                            "tokenizer_config.json: not valid JSON"),
        "config not an object": (lambda: cfg.write_text("[1, 2]"),
                                 "tokenizer_config.json: must hold a JSON object"),
        "eos not in vocabulary": (lambda: _edit_json(cfg, _set("eos_token", "<|nope|>")),
                                  "tokenizer_config.json: key 'eos_token' ('<|nope|>') is not"),
        "no eos": (lambda: _edit_json(cfg, lambda d: d.pop("eos_token")),
                   "tokenizer_config.json: no 'eos_token'"),
        "eos of a wrong type": (lambda: _edit_json(cfg, _set("eos_token", 7)),
                                "tokenizer_config.json: key 'eos_token' must be a string"),
        "template in config does not compile": (
            lambda: (jinja.unlink(),  # the file would win over the config
                     _edit_json(cfg, _set("chat_template", "{% for m in messages %}{{ m }"))),
            "tokenizer_config.json key 'chat_template': the chat template does not compile"),
        "template list malformed": (
            lambda: (jinja.unlink(), _edit_json(cfg, _set("chat_template", [{"name": "x"}]))),
            "tokenizer_config.json: key 'chat_template[0]'"),
        "chat_template.jinja does not compile": (
            lambda: jinja.write_text("{% if x %}never closed"),
            "chat_template.jinja: the chat template does not compile (template line 1"),
        "added_tokens_decoder malformed": (
            lambda: _edit_json(cfg, _set("added_tokens_decoder", {"x": "y"})),
            "tokenizer_config.json: key 'added_tokens_decoder.x'"),
        "generation eos not ints": (lambda: gen.write_text(json.dumps({"eos_token_id": ["2"]})),
                                    "generation_config.json: key 'eos_token_id'"),
        "generation eos out of range": (
            lambda: gen.write_text(json.dumps({"eos_token_id": [10**7]})),
            "generation_config.json: eos_token_id 10000000 is outside the vocabulary"),
        "generation_config not JSON": (lambda: gen.write_text("{"),
                                       "generation_config.json: not valid JSON"),
    }


CASES = sorted(_bad_folders(Path("x")))


@pytest.mark.parametrize("case", CASES)
def test_bad_folder_is_a_one_line_error(save_hf: Saver, case: str) -> None:
    folder = save_hf(chat_template="{{ messages[0].content }}")
    contents = {p: p.read_text() for p in folder.iterdir() if p.is_file()}
    breaks, expected = _bad_folders(folder)[case]
    breaks()
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(folder)
    msg = str(err.value)
    assert expected in msg, msg
    assert str(folder) in msg and "\n" not in msg and len(msg) < 400, msg
    for text in contents.values():  # no file is dumped into the message
        assert len(text) < 40 or text[:40] not in msg


def test_not_a_folder(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="no such tokenizer folder"):
        load_tokenizer(tmp_path / "absent")


def test_char_description_error_does_not_dump_the_dict() -> None:
    big = {"version": "1.0", "model": {"vocab": {f"t{i}": i for i in range(500)}}}
    with pytest.raises(TokenizerError) as err:
        CharTokenizer.from_dict(big, where="run/policy/tokenizer.json")
    msg = str(err.value)
    assert msg.startswith("run/policy/tokenizer.json: key 'type'") and "t499" not in msg
    assert len(msg) < 200
