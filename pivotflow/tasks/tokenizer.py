"""A character-level tokenizer for the tiny task kit: one id per character, plus specials."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pivotflow.errors import TokenizerError

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"


class CharTokenizer:
    """Maps each known character to one id. Ids 0..2 are pad, bos, eos."""

    def __init__(self, chars: str) -> None:
        if len(set(chars)) != len(chars):
            raise TokenizerError(f"duplicate characters in tokenizer alphabet {chars!r}")
        self.chars = chars
        self.specials = (PAD, BOS, EOS)
        self._to_id = {c: i + len(self.specials) for i, c in enumerate(chars)}
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        # id -> text tables: decoding runs on every result the controller gets
        self._text = ["" for _ in self.specials] + list(chars)
        self._text_specials = list(self.specials) + list(chars)

    @property
    def vocab_size(self) -> int:
        return len(self.specials) + len(self.chars)

    def encode(self, text: str, *, bos: bool = False) -> list[int]:
        """Ids of ``text``; raises TokenizerError naming the first unknown character."""
        to_id = self._to_id
        try:
            ids = [to_id[ch] for ch in text]
        except KeyError:
            pos = next(i for i, ch in enumerate(text) if ch not in to_id)
            raise TokenizerError(
                f"character {text[pos]!r} at position {pos} of {text!r} is not in the alphabet "
                f"{self.chars!r}"
            ) from None
        return [self.bos_id, *ids] if bos else ids

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """Text of ``ids``; raises TokenizerError for an id outside the vocabulary."""
        seq = ids if isinstance(ids, (list, tuple)) else list(ids)
        if seq and (min(seq) < 0 or max(seq) >= len(self._text)):
            bad = next(t for t in seq if not 0 <= t < len(self._text))
            raise TokenizerError(f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")
        table = self._text if skip_special else self._text_specials
        return "".join([table[t] for t in seq])

    def to_dict(self) -> dict[str, object]:
        return {"type": "char", "chars": self.chars}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> CharTokenizer:
        chars = data.get("chars")
        if data.get("type") != "char" or not isinstance(chars, str):
            raise TokenizerError(f"not a char tokenizer description: {data!r}")
        return cls(chars)


# One alphabet for every built-in task, policy and judge alike: printable ASCII and newline, so
# tool calls (JSON) fit too and every model of the kit shares one vocabulary.
TASK_ALPHABET = "".join(chr(c) for c in range(32, 127)) + "\n"


def default_tokenizer() -> CharTokenizer:
    return CharTokenizer(TASK_ALPHABET)


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[list[list[int]], list[list[int]]]:
    """Right-pad to the longest; returns (ids, mask) as nested lists."""
    width = max((len(s) for s in seqs), default=0)
    ids = [list(s) + [pad_id] * (width - len(s)) for s in seqs]
    mask = [[1] * len(s) + [0] * (width - len(s)) for s in seqs]
    return ids, mask
