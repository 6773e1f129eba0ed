"""The token layout of a multi-turn, tool-calling trajectory, shared by rollout and bootstrap.

A trajectory is the prompt followed by alternating policy turns and tool observations, kept as
token ids with a loss mask, never re-tokenized from text::

    <bos>47+38=                                               prompt        (not in the mask)
    <tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>  policy turn   mask 1
    \\n<tool_response>\\n85\\n</tool_response>\\n                  observation   mask 0
    85<eos>                                                   policy turn   mask 1

A policy turn ends at EOS, at its token budget, or right after a call closes (the engine stops on
the parser's stop strings); the answer is the text of the last policy turn. Observations are
encoded on their own by the model's tokenizer and appended as ids, so with a BPE tokenizer the
ids at a turn's edge are not what encoding the whole text would give: the trainer sees exactly
the ids the policy was conditioned on (token-in, token-out).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pivotflow.errors import TokenizerError
from pivotflow.tokenizer.base import Tokenizer
from pivotflow.tools.parsers import ToolCallParser

REPLACEMENT = "?"  # stands for a character of a tool's output the tokenizer cannot encode
INCOMPLETE = "\ufffd"  # what decode shows for the bytes of an unfinished UTF-8 character


class Observed(Protocol):
    """What an observation is made of: a tool result's name and content."""

    @property
    def name(self) -> str: ...

    @property
    def content(self) -> str: ...


def observation_text(parser: ToolCallParser, results: Sequence[Observed]) -> str:
    """The text appended after a policy turn that made calls: each result in the parser's
    format, on its own lines."""
    return "\n" + "\n".join(parser.format_result(r.name, r.content) for r in results) + "\n"


def encode_observation(tok: Tokenizer, text: str) -> list[int]:
    """Ids of ``text`` by the model's tokenizer (a byte-level BPE encodes anything). A tokenizer
    with a fixed alphabet (the char one) raises on a character it lacks: those characters are
    replaced, since a tool may print anything and what it printed must never crash the sample."""
    try:
        return tok.encode(text)
    except TokenizerError:
        pass
    known: dict[str, bool] = {}
    for c in set(text):
        try:
            tok.encode(c)
            known[c] = True
        except TokenizerError:
            known[c] = False
    return tok.encode("".join(c if known[c] else REPLACEMENT for c in text))


def turn_text(tok: Tokenizer, before: Sequence[int], new: Sequence[int]) -> str:
    """The text the tokens ``new`` add after ``before`` (the trajectory so far): decoded in
    context, so a byte-level token that completes a character begun in ``before`` counts here
    (a character still incomplete at the end of ``new`` shows as U+FFFD, as ``decode`` shows
    it)."""
    if not before:
        return tok.decode(new)
    full = tok.decode([*before, *new])
    prior = tok.decode(before).rstrip(INCOMPLETE)  # its unfinished character is not yet text
    return full[len(prior):] if full.startswith(prior) else tok.decode(new)


def answer_of(turn_texts: Sequence[str]) -> str:
    """The trajectory's answer: the last policy turn's text ("" when there is none)."""
    return turn_texts[-1] if turn_texts else ""
