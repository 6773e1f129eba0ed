"""What every tokenizer offers the controller, the workers and the task kit.

The controller imports only this module and its implementations (no torch): a Hugging Face
tokenizer folder (``hf.py``) for real models and the built-in ones, and the character tokenizer
(``char.py``) that the simulator uses for cheap stand-in text.

Ids are ``0 .. vocab_size - 1`` including added/special tokens (``len(tokenizer)`` in
transformers' terms); the model's embedding may be larger than that, never smaller.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

Message = dict[str, Any]  # {"role": "user", "content": "..."} as in transformers and vLLM


class IncrementalDetokenizer(Protocol):
    """Decodes a token stream as it grows, so text that straddles tokens (a stop string, a
    ``</tool_call>`` tag, a multi-byte character split over byte-level tokens) is seen whole.

    ``push`` returns only the text that became final with the new ids: a byte-level token that
    ends in the middle of a UTF-8 character yields nothing until the character completes.
    """

    text: str  # everything final so far

    def push(self, ids: Sequence[int]) -> str:
        """Append ids; return the newly final text (may be empty)."""
        ...

    def finish(self) -> str:
        """At the end of the stream: the text still held back (a trailing incomplete character,
        as ``decode`` shows it), so the pushes plus ``finish`` add up to ``decode(all ids)``."""
        ...


@runtime_checkable
class Tokenizer(Protocol):
    """encode/decode, special ids, chat templates, incremental detokenization."""

    name_or_path: str
    vocab_size: int  # every id the tokenizer can produce is below this
    eos_id: int  # the token a finished response ends with (SFT labels end in it)
    eos_ids: tuple[int, ...]  # every stop token: eos_id, then generation_config's eos ids
    pad_id: int
    bos_id: int | None  # None where the model has none (Qwen)
    special_ids: frozenset[int]
    chat_template: str | None

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Ids of ``text``. ``add_special_tokens`` adds what the tokenizer's post-processor adds
        to a raw prompt (Llama 3's BOS; nothing for Qwen)."""
        ...

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        """Text of ``ids``; raises TokenizerError for an id outside the vocabulary."""
        ...

    def apply_chat_template(self, messages: Sequence[Message], *,
                            add_generation_prompt: bool = True,
                            tools: Sequence[dict[str, Any]] | None = None,
                            **kwargs: Any) -> str:
        """Render ``messages`` exactly as transformers' ``apply_chat_template(tokenize=False)``
        does; raises TokenizerError when the tokenizer has no chat template or it fails."""
        ...

    def stream(self, *, skip_special: bool = True) -> IncrementalDetokenizer:
        """A fresh incremental detokenizer over this tokenizer."""
        ...

    def save(self, directory: str | Path) -> None:
        """Write the files that load this tokenizer back (and, for HF folders, load with
        ``transformers.AutoTokenizer.from_pretrained``) into ``directory``."""
        ...
