"""Tool-call formats: find calls in generated text, format results, spot a call as it closes.

``ToolCallParser`` is the extension point; ``PythonBlockParser`` (``"python_block"``) reads
Qwen2.5-Math's and ToRL's ```` ```python ```` blocks as calls of the code interpreter;
``HermesParser`` reads the Hermes/Qwen format::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2+2"}}
    </tool_call>

and writes results as ``<tool_response>\\n...\\n</tool_response>`` (Qwen2.5's chat template).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pivotflow.errors import ToolCallError
from pivotflow.tokenizer.base import Tokenizer


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One parsed call: tool name, JSON arguments, and where it sat in the text."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    span: tuple[int, int] = (0, 0)  # [start, end) of the whole call, tags included


@runtime_checkable
class ToolCallParser(Protocol):
    """A tool-call format. Parsing never raises: a malformed call is returned as ToolCallError."""

    #: strings an engine may stop generation on (the end of a call)
    stop_strings: tuple[str, ...]

    def parse(self, text: str) -> list[ToolCall] | ToolCallError:
        """Every call in ``text`` in order ([] if none), or the error of the first bad one."""
        ...

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        """The text a model writes to make this call (for bootstrap examples)."""
        ...

    def format_result(self, name: str, content: str) -> str:
        """The text that hands a tool's result back to the model."""
        ...

    def call_closed(self, text: str, new_chars: int | None = None) -> bool:
        """Whether a complete call closed within the last ``new_chars`` of ``text``."""
        ...


class HermesParser:
    """The Hermes / Qwen2.5 format: a JSON object between ``<tool_call>`` tags."""

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def __init__(self, *, newlines: bool = True, result_json: bool = False) -> None:
        """``newlines``: put the JSON on its own line when formatting (Qwen's template does);
        ``result_json``: format results as ``{"name", "content"}`` (Hermes) not bare text (Qwen).
        """
        self.newlines = newlines
        self.result_json = result_json
        self.stop_strings: tuple[str, ...] = (self.close_tag,)

    def parse(self, text: str) -> list[ToolCall] | ToolCallError:
        """Every call in ``text``, or a ToolCallError describing the first malformed one.

        Malformed: a ``<tool_call>`` with no close tag, a close tag with no open one, a body that
        is not a JSON object, a missing or non-string ``name``, or ``arguments`` that are not an
        object (a JSON string holding an object, as OpenAI sends it, is accepted).
        """
        calls: list[ToolCall] = []
        pos = 0
        while True:
            start = text.find(self.open_tag, pos)
            stray = text.find(self.close_tag, pos)
            if stray != -1 and (start == -1 or stray < start):
                return ToolCallError(
                    f"'{self.close_tag}' at char {stray} has no '{self.open_tag}' before it"
                )
            if start == -1:
                return calls
            body_start = start + len(self.open_tag)
            end = text.find(self.close_tag, body_start)
            if end == -1:
                return ToolCallError(
                    f"'{self.open_tag}' at char {start} is never closed with '{self.close_tag}'"
                )
            inner = text.find(self.open_tag, body_start, end)
            if inner != -1:
                return ToolCallError(
                    f"'{self.open_tag}' at char {start} is not closed before "
                    f"the next '{self.open_tag}' at char {inner}"
                )
            stop = end + len(self.close_tag)
            call = self._parse_body(text[body_start:end], start, (start, stop))
            if isinstance(call, ToolCallError):
                return call
            calls.append(call)
            pos = stop

    def _parse_body(self, body: str, at: int, span: tuple[int, int]) -> ToolCall | ToolCallError:
        try:
            obj = json.loads(body)
        except (json.JSONDecodeError, RecursionError) as exc:
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            return ToolCallError(
                f"malformed tool call JSON at char {at}: {msg}: {_clip(body.strip())}"
            )
        if not isinstance(obj, dict):
            return ToolCallError(
                f'tool call at char {at} must be a JSON object with "name" '
                f'and "arguments", got {type(obj).__name__}: {_clip(body.strip())}'
            )
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            return ToolCallError(
                f'tool call at char {at} has no string "name": {_clip(body.strip())}'
            )
        args = obj.get("arguments", {})
        if isinstance(args, str):  # OpenAI sends arguments as a JSON-encoded string
            try:
                args = json.loads(args) if args.strip() else {}
            except (json.JSONDecodeError, RecursionError):
                return ToolCallError(
                    f'tool call {name!r} at char {at}: "arguments" is a '
                    f"string that is not JSON: {_clip(obj['arguments'])}"
                )
        if args is None:
            args = {}
        if not isinstance(args, dict):
            return ToolCallError(
                f'tool call {name!r} at char {at}: "arguments" must be a '
                f"JSON object, got {type(args).__name__}"
            )
        return ToolCall(name, args, span)

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        """``<tool_call>{"name": ..., "arguments": ...}</tool_call>``."""
        body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        sep = "\n" if self.newlines else ""
        return f"{self.open_tag}{sep}{body}{sep}{self.close_tag}"

    def format_result(self, name: str, content: str) -> str:
        """``<tool_response>\\ncontent\\n</tool_response>`` (JSON with the name if result_json)."""
        if self.result_json:
            content = json.dumps({"name": name, "content": content}, ensure_ascii=False)
        return f"<tool_response>\n{content}\n</tool_response>"

    def call_closed(self, text: str, new_chars: int | None = None) -> bool:
        """True if a ``</tool_call>`` that closes an open ``<tool_call>`` ends in the last
        ``new_chars`` characters of ``text`` (default: anywhere). Cheap: scans only the tail."""
        tail_from = (
            0 if new_chars is None else max(0, len(text) - new_chars - len(self.close_tag) + 1)
        )
        end = text.find(self.close_tag, tail_from)
        if end == -1:
            return False
        return text.rfind(self.open_tag, 0, end) != -1


class ToolCallWatcher:
    """Watches a generation token by token and says when a tool call has just closed.

    ``push(ids)`` feeds the ids through the tokenizer's incremental detokenizer
    (``tokenizer.stream()``), so a ``</tool_call>`` split over byte-level BPE tokens, or a
    multi-byte character split over them, is seen whole once its last byte arrives; text that
    is already decoded goes to ``push_text``.
    """

    def __init__(self, parser: ToolCallParser | None = None,
                 tokenizer: Tokenizer | None = None) -> None:
        self.parser: ToolCallParser = parser if parser is not None else HermesParser()
        self.tokenizer = tokenizer
        self._stream = tokenizer.stream() if tokenizer is not None else None
        self.text = ""

    def push_text(self, piece: str) -> bool:
        """Append decoded text; True if a complete call closed inside it."""
        self.text += piece
        return bool(piece) and self.parser.call_closed(self.text, len(piece))

    def push(self, ids: Sequence[int]) -> bool:
        """Append token ids; True if a complete call closed inside them.

        Raises ToolCallError if the watcher was built without ``tokenizer``.
        """
        if self._stream is None:
            raise ToolCallError("ToolCallWatcher.push needs a tokenizer; use push_text")
        return self.push_text(self._stream.push(ids))

    def reset(self) -> None:
        """Forget the text so far (at the start of a new turn)."""
        self.text = ""
        if self.tokenizer is not None:
            self._stream = self.tokenizer.stream()


class PythonBlockParser:
    """Tool-integrated reasoning as Qwen2.5-Math, ToRL and SimpleTIR write it: the policy
    writes a ```` ```python ```` block, then ```` ```output ````, where generation stops; the
    block is a call of the ``code_interpreter`` tool, and its result continues the text, the
    fence closed after it::

        ```python
        print(2 ** 10)
        ```
        ```output
        1024
        ```

    (the policy's turn ends at ```` ```output ````, the observation is the lines after it).
    A turn is a call only when it ends at ```` ```output ```` with a python block before it."""

    tool = "code_interpreter"
    open_tag = "```python"
    output_tag = "```output"

    def __init__(self) -> None:
        self.stop_strings: tuple[str, ...] = (self.output_tag,)

    def parse(self, text: str) -> list[ToolCall] | ToolCallError:
        """The python block before the closing ```` ```output ```` as one call, [] when the
        text does not end there, or the error of a block that is not there or not closed."""
        end = text.rstrip().rfind(self.output_tag)
        if end == -1 or text.rstrip()[end:] != self.output_tag:
            return []
        start = text.rfind(self.open_tag, 0, end)
        if start == -1:
            return ToolCallError(f"'{self.output_tag}' at char {end} has no "
                                 f"'{self.open_tag}' block before it")
        body = text[start + len(self.open_tag):end].rstrip()
        if not body.endswith("```"):
            return ToolCallError(f"the '{self.open_tag}' block at char {start} is not closed "
                                 f"with ``` before '{self.output_tag}'")
        code = body[:-3].strip("\n")
        return [ToolCall(self.tool, {"code": code}, (start, end + len(self.output_tag)))]

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        return f"{self.open_tag}\n{arguments.get('code', '')}\n```\n{self.output_tag}"

    def format_result(self, name: str, content: str) -> str:
        """The program's output, and the fence ```` ```output ```` opened, closed."""
        return f"{content.rstrip(chr(10))}\n```"

    def call_closed(self, text: str, new_chars: int | None = None) -> bool:
        """True if the text ends at ```` ```output ```` (new in the last ``new_chars``
        characters) with a python block before it."""
        stripped = text.rstrip()
        if not stripped.endswith(self.output_tag):
            return False
        end = len(stripped) - len(self.output_tag)
        if new_chars is not None and end < len(text) - new_chars - len(self.output_tag):
            return False
        return text.rfind(self.open_tag, 0, end) != -1


# tool-call formats by the name a graph gives (``generate(..., tool_parser="hermes")``)
PARSERS: dict[str, Callable[[], ToolCallParser]] = {"hermes": HermesParser,
                                                    "python_block": PythonBlockParser}


def make_parser(name: str) -> ToolCallParser:
    """The parser registered as ``name``; raises ToolCallError naming the known ones."""
    factory = PARSERS.get(name)
    if factory is None:
        raise ToolCallError(f"unknown tool-call format {name!r}; known: {sorted(PARSERS)}")
    return factory()


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
