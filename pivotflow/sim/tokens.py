"""Cheap stand-ins for text in the simulator: a fast char tokenizer and synthetic prompts.

Simulated responses are real token ids of the char tokenizer, of the simulated length, so the
controller counts, decodes and re-encodes them exactly as in a real run (tokens generated,
the judge's template over the response, the trainer's sequences). Only the speed differs:
``SimTokenizer`` maps ids and text through ``bytes.translate`` (C speed) instead of a Python
loop per character; it returns what ``CharTokenizer`` returns and raises what it raises.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from pivotflow.errors import TokenizerError
from pivotflow.tasks.registry import Problem
from pivotflow.tokenizer.char import TASK_ALPHABET, CharTokenizer

# Filler characters of simulated text; any printable character of the alphabet would do.
FILLER = "a"


class SimTokenizer(CharTokenizer):
    """A ``CharTokenizer`` over an ASCII alphabet with C-speed ``encode`` and ``decode``.

    ``compact=True`` (the simulator's): ``encode`` returns the ids as ``bytes`` (every id is
    below 256), which the controller and the simulated workers use as they use a list of ids
    (``len``, iteration, ``bytes(ids)``) without a Python int object per token.
    """

    def __init__(self, chars: str = TASK_ALPHABET, *, compact: bool = False) -> None:
        super().__init__(chars)
        self.compact = compact
        if any(ord(c) > 127 for c in chars) or self.vocab_size > 256:
            raise TokenizerError("SimTokenizer needs an ASCII alphabet of at most 253 characters")
        n = len(self.specials)
        dec = bytearray(256)
        enc = bytearray(256)
        for i, c in enumerate(chars):
            dec[i + n] = ord(c)
            enc[ord(c)] = i + n
        self._dec = bytes(dec)
        self._enc = bytes(enc)
        self._drop = bytes(range(n))  # specials are skipped by decode
        self._known = chars.encode("ascii")  # deleting these leaves only unknown characters
        self._ids = bytes(range(self.vocab_size))  # deleting these leaves only unknown ids
        self._bos = bytes([self._bos_id])

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Ids of ``text``; raises TokenizerError naming the first unknown character."""
        lead = add_special_tokens
        try:
            raw = text.encode("ascii")
        except UnicodeEncodeError:
            return super().encode(text, add_special_tokens=lead)  # the slow path names it
        if raw.translate(None, self._known):
            return super().encode(text, add_special_tokens=lead)
        ids = raw.translate(self._enc)
        if self.compact:
            return self._bos + ids if lead else ids  # type: ignore[return-value]  # see class doc
        return [self._bos_id, *ids] if lead else list(ids)

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """Text of ``ids``; raises TokenizerError for an id outside the vocabulary."""
        if not skip_special:
            return super().decode(ids, skip_special=skip_special)
        try:
            raw = bytes(ids)
        except (ValueError, TypeError):
            return super().decode(ids)  # raises TokenizerError for the bad id
        if raw.translate(None, self._ids):  # C speed; ``max(raw)`` makes an int per byte
            return super().decode(ids)
        return raw.translate(self._dec, self._drop).decode("ascii")


class SimProblems:
    """Synthetic prompts of a log-normal token length (the ``ProblemStream`` interface the
    ``PromptSource`` reads: ``next()``, ``cursor``, ``check``). No exact rule: ``check`` is None."""

    def __init__(self, median_tokens: int, sigma: float, cap: int, seed: int) -> None:
        self.median, self.sigma, self.cap = median_tokens, sigma, cap
        self.rng = random.Random(seed)
        self.cursor = 0

    def next(self) -> Problem:
        self.cursor += 1
        n = min(self.cap, max(1, round(self.rng.lognormvariate(0.0, self.sigma) * self.median)))
        # The prompt's number leads it (its length unchanged), so each prompt's text is its
        # own: a workload whose responses to one prompt are alike (group_share) keys on it.
        tag = str(self.cursor)[:n]
        return Problem(prompt=tag + FILLER * (n - len(tag)), answer="")

    def check(self, answer: str, completion: str) -> bool | None:
        return None
