"""Incremental detokenization and stop-string scanning over a growing token stream.

A byte-level BPE token may hold half of a UTF-8 character, and a word-piece decoder may change
how a token reads depending on its neighbours (SentencePiece's leading space), so decoding
token by token and concatenating is wrong. ``WindowDetokenizer`` does what vLLM's detokenizer
does: it keeps two offsets into the ids, decodes the window from ``prefix`` with and without
the ids after ``read``, and emits the difference, holding it back while it ends in U+FFFD (an
incomplete character). The window restarts at every emission, so each push decodes a few
tokens, not the whole response.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"  # what a decoder shows for an incomplete UTF-8 sequence


class WindowDetokenizer:
    """Incremental detokenizer over any ``decode(ids) -> str``.

    ``text`` is everything final so far; ``push`` returns what became final. ``finish`` returns
    what is still held back (a trailing incomplete character, as ``decode`` shows it), so that
    the pushes plus ``finish`` always add up to ``decode(all ids)``.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # ids before this are emitted
        self._prefix_text = ""  # decode(ids[_prefix:_read]), kept so a push decodes once

    def push(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        self.ids.extend(ids)
        new_text = self._decode(self.ids[self._prefix:])
        if len(new_text) <= len(self._prefix_text) or new_text.endswith(REPLACEMENT):
            return ""  # nothing yet (specials skipped), or a character still incomplete
        out = new_text[len(self._prefix_text):]
        self._prefix, self._read = self._read, len(self.ids)
        self._prefix_text = self._decode(self.ids[self._prefix:self._read])
        self.text += out
        return out

    def finish(self) -> str:
        """The held-back tail (empty unless the stream ended inside a character)."""
        if self._read == len(self.ids):
            return ""
        tail = self._decode(self.ids[self._prefix:])[len(self._prefix_text):]
        self._prefix, self._read = self._read, len(self.ids)
        self._prefix_text = self._decode(self.ids[self._prefix:self._read])
        self.text += tail
        return tail


class StopScanner:
    """Finds the first of ``stops`` in a streamed text, including one that straddles pushes.

    Each ``feed`` scans only the new text and the ``longest stop - 1`` characters before it, so
    a long response costs what its new text costs.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._overlap = max((len(s) for s in self.stops), default=1) - 1
        self.text = ""
        self.found: tuple[int, str] | None = None  # (index in text, the stop string)

    def feed(self, chunk: str) -> tuple[int, str] | None:
        """Append ``chunk``; return (start index in ``text``, stop) of the stop that ends first
        (the one a character-by-character stream would meet first), once one has appeared
        (and from then on)."""
        if self.found is not None or not chunk:
            return self.found
        start = max(0, len(self.text) - self._overlap)
        self.text += chunk
        hits = [(i, s) for s in self.stops if (i := self.text.find(s, start)) >= 0]
        if hits:
            self.found = min(hits, key=lambda h: (h[0] + len(h[1]), h[0]))
        return self.found
