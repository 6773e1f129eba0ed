"""The char tokenizer behind the same interface as Hugging Face ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from pivotflow.errors import TokenizerError
from pivotflow.sim.tokens import SimTokenizer
from pivotflow.tokenizer import TASK_ALPHABET, CharTokenizer, Tokenizer, load_tokenizer


@pytest.mark.parametrize("tok", [CharTokenizer(TASK_ALPHABET), SimTokenizer()])
def test_char_tokenizer_interface(tok: CharTokenizer) -> None:
    assert isinstance(tok, Tokenizer)
    assert tok.eos_ids == (tok.eos_id,) == (2,) and tok.special_ids == {0, 1, 2}
    assert (tok.pad_id, tok.bos_id, tok.chat_template) == (0, 1, None)
    ids = tok.encode("7*6=42")
    assert tok.encode("7*6=42", add_special_tokens=True) == [tok.bos_id, *ids]
    assert tok.decode([tok.bos_id, *ids, tok.eos_id]) == "7*6=42"
    assert tok.decode([tok.bos_id, *ids], skip_special=False) == "<bos>7*6=42"
    stream = tok.stream()
    assert [stream.push([i]) for i in ids] == list("7*6=42") and stream.text == "7*6=42"


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    CharTokenizer("abc\n").save(tmp_path)
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, CharTokenizer) and tok.chars == "abc\n"
    assert tok.name_or_path == str(tmp_path)
    with pytest.raises(TokenizerError, match="not in the alphabet"):
        tok.encode("abd")
