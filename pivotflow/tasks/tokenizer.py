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

    @property
    def vocab_size(self) -> int:
        return len(self.specials) + len(self.chars)

    def encode(self, text: str, *, bos: bool = False) -> list[int]:
        """Ids of ``text``; raises TokenizerError naming the first unknown character."""
        ids = [self.bos_id] if bos else []
        for pos, ch in enumerate(text):
            tid = self._to_id.get(ch)
            if tid is None:
                raise TokenizerError(
                    f"character {ch!r} at position {pos} of {text!r} is not in the alphabet "
                    f"{self.chars!r}"
                )
            ids.append(tid)
        return ids

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """Text of ``ids``; raises TokenizerError for an id outside the vocabulary."""
        out = []
        n = len(self.specials)
        for tid in ids:
            if not 0 <= tid < self.vocab_size:
                raise TokenizerError(f"token id {tid} is outside the vocabulary (0..{self.vocab_size - 1})")
            if tid < n:
                if not skip_special:
                    out.append(self.specials[tid])
                continue
            out.append(self.chars[tid - n])
        return "".join(out)

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
