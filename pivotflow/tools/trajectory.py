"""The token layout of a multi-turn, tool-calling trajectory, shared by rollout and bootstrap.

A trajectory is the prompt followed by alternating policy turns and tool observations, kept as
token ids with a loss mask, never re-tokenized from text::

    <bos>47+38=                                               prompt        (not in the mask)
    <tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>  policy turn   mask 1
    \\n<tool_response>\\n85\\n</tool_response>\\n                  observation   mask 0
    85<eos>                                                   policy turn   mask 1

A policy turn ends at EOS, at its token budget, or right after a call closes (the engine stops on
the parser's stop strings); the answer is the text of the last policy turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pivotflow.tasks.tokenizer import CharTokenizer
from pivotflow.tools.parsers import ToolCallParser

REPLACEMENT = "?"  # stands for a character of a tool's output the tokenizer cannot encode


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


def encode_observation(tok: CharTokenizer, text: str) -> list[int]:
    """Ids of ``text`` with every character outside the tokenizer's alphabet replaced: a tool
    may print anything, and what it printed must never crash the sample."""
    known = frozenset(tok.chars)
    return tok.encode("".join(c if c in known else REPLACEMENT for c in text))


def answer_of(turn_texts: Sequence[str]) -> str:
    """The trajectory's answer: the last policy turn's text ("" when there is none)."""
    return turn_texts[-1] if turn_texts else ""
