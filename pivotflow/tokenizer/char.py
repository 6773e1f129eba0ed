"""A character-level tokenizer: one id per character, plus pad, bos and eos.

The simulator's stand-in text (``sim/tokens.py``) and old run folders (a ``tokenizer.json`` of
``{"type": "char", "chars": ...}``) use it; real and built-in models use ``hf.HFTokenizer``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pivotflow.errors import TokenizerError
from pivotflow.tokenizer.base import Message

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"

# One alphabet for every built-in task, policy and judge alike: printable ASCII and newline, so
# tool calls (JSON) fit too and every model of the kit shares one vocabulary.
TASK_ALPHABET = "".join(chr(c) for c in range(32, 127)) + "\n"


class CharStream:
    """Incremental detokenizer of a char tokenizer: every id decodes on its own, so nothing is
    ever held back."""

    def __init__(self, tok: CharTokenizer, skip_special: bool) -> None:
        self._tok, self._skip = tok, skip_special
        self.text = ""

    def push(self, ids: Sequence[int]) -> str:
        new = self._tok.decode(ids, skip_special=self._skip)
        self.text += new
        return new

    def finish(self) -> str:
        return ""


class CharTokenizer:
    """Maps each known character to one id. Ids 0..2 are pad, bos, eos."""

    chat_template: str | None = None

    def __init__(self, chars: str, *, name_or_path: str = "char") -> None:
        if len(set(chars)) != len(chars):
            raise TokenizerError(f"duplicate characters in tokenizer alphabet {chars!r}")
        self.chars = chars
        self.name_or_path = name_or_path
        self.specials = (PAD, BOS, EOS)
        self._to_id = {c: i + len(self.specials) for i, c in enumerate(chars)}
        self.pad_id, self.eos_id = 0, 2
        self._bos_id = 1
        self.bos_id: int | None = self._bos_id  # typed as the interface has it (Qwen has none)
        self.vocab_size = len(self.specials) + len(chars)
        self.eos_ids: tuple[int, ...] = (self.eos_id,)
        self.special_ids = frozenset(range(len(self.specials)))
        # id -> text tables: decoding runs on every result the controller gets
        self._text = ["" for _ in self.specials] + list(chars)
        self._text_specials = list(self.specials) + list(chars)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Ids of ``text``, led by BOS when ``add_special_tokens``; raises TokenizerError naming
        the first unknown character."""
        to_id = self._to_id
        try:
            ids = [to_id[ch] for ch in text]
        except KeyError:
            pos = next(i for i, ch in enumerate(text) if ch not in to_id)
            raise TokenizerError(
                f"character {text[pos]!r} at position {pos} of {text!r} is not in the alphabet "
                f"{self.chars!r}"
            ) from None
        return [self._bos_id, *ids] if add_special_tokens else ids

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """Text of ``ids``; raises TokenizerError for an id outside the vocabulary."""
        seq = ids if isinstance(ids, (list, tuple)) else list(ids)
        if seq and (min(seq) < 0 or max(seq) >= len(self._text)):
            bad = next(t for t in seq if not 0 <= t < len(self._text))
            raise TokenizerError(f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")
        table = self._text if skip_special else self._text_specials
        return "".join([table[t] for t in seq])

    def apply_chat_template(self, messages: Sequence[Message], *,
                            add_generation_prompt: bool = True,
                            tools: Sequence[dict[str, Any]] | None = None,
                            **kwargs: Any) -> str:
        raise TokenizerError(
            f"the char tokenizer ({self.name_or_path}) has no chat template: give the prompt as a "
            "string, or use a model folder whose tokenizer has one")

    def stream(self, *, skip_special: bool = True) -> CharStream:
        return CharStream(self, skip_special)

    def save(self, directory: str | Path) -> None:
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        (out / "tokenizer.json").write_text(json.dumps(self.to_dict()))

    def to_dict(self) -> dict[str, object]:
        return {"type": "char", "chars": self.chars}

    @classmethod
    def from_dict(cls, data: object, *, where: str = "tokenizer.json",
                  name_or_path: str = "char") -> CharTokenizer:
        """The tokenizer a ``to_dict`` description names; ``where`` (a file) goes in the error."""
        if not isinstance(data, dict):
            raise TokenizerError(f"{where}: not a char tokenizer description (a JSON "
                                 f"{type(data).__name__}, not an object)")
        if data.get("type") != "char":
            raise TokenizerError(f"{where}: key 'type' is {str(data.get('type'))[:40]!r}, not "
                                 "'char' (not a char tokenizer description)")
        chars = data.get("chars")
        if not isinstance(chars, str):
            raise TokenizerError(f"{where}: key 'chars' must be a string of characters")
        return cls(chars, name_or_path=name_or_path)


def default_tokenizer() -> CharTokenizer:
    return CharTokenizer(TASK_ALPHABET)
