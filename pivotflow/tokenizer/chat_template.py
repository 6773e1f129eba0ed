"""Chat templates rendered as transformers' ``apply_chat_template(tokenize=False)`` renders them.

The same sandboxed Jinja environment (``trim_blocks``, ``lstrip_blocks``, loop controls, the
``{% generation %}`` tag), the same globals (``raise_exception``, ``strftime_now``, a ``dict`` and
a ``namespace`` that refuse underscore names), the same ``tojson`` (no HTML escaping), and the
same preparation of the inputs: keys whose value is None are dropped, reasoning is aliased under
``reasoning_content`` and ``thinking``, and everything is rebuilt from plain JSON types. Chat
templates come from model folders found on the Hub: they are untrusted code, hence the sandbox.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pivotflow.errors import TokenizerError
from pivotflow.tokenizer.base import Message

# Names a message's reasoning comes under; templates read the first (transformers aliases them).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text for transformers' loss
    masks; rendering as text, it is its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


class _TemplateDict:
    """``dict(...)`` in a template, without the type's attributes to climb through."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses underscore-led attribute names (CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805  # Namespace's own signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-led attribute {name!r} on a namespace")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML, which would change the prompt
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """The compiled template; raises jinja2.TemplateSyntaxError (callers name the file)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env.from_string(source)


def check_template(source: str, where: str) -> None:
    """Raise TokenizerError (one line naming ``where``) if ``source`` does not compile."""
    try:
        compile_template(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TokenizerError(
            f"{where}: the chat template does not compile (template line {exc.lineno}: "
            f"{_one_line(exc.message or str(exc))})") from None


def plain(value: Any) -> Any:
    """``value`` rebuilt from JSON types only; anything else becomes ``"<TypeName>"``, so the
    sandbox never sees an object whose methods it does not know to be harmless."""
    kind = type(value)
    if value is None or kind in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if kind.__module__ == "numpy" and callable(getattr(value, "item", None)):
        return plain(value.item())  # np.bool_(False) must stay falsy
    if callable(getattr(value, "model_dump", None)):  # pydantic messages (the OpenAI SDK's)
        return plain(value.model_dump())
    return f"<{kind.__name__}>"


def prepare_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages as the template sees them: None-valued keys dropped, reasoning aliased."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TokenizerError(f"chat messages must be a list of dicts, not a "
                             f"{type(messages).__name__}")
    if not messages:
        raise TokenizerError("cannot render a chat template over an empty list of messages")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise TokenizerError(f"chat message {i} must be a dict with 'role' and 'content', "
                                 f"not a {type(msg).__name__}")
        msg = plain({k: v for k, v in msg.items() if v is not None})
        reasoning = next((msg[k] for k in REASONING_FIELDS if msg.get(k) is not None), None)
        if reasoning is not None:
            msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
        out.append(msg)
    return out


def render(source: str, messages: Sequence[Message], *, add_generation_prompt: bool,
           tools: Sequence[dict[str, Any]] | None, documents: Sequence[dict[str, Any]] | None,
           variables: Mapping[str, Any], where: str) -> str:
    """Render ``source`` over ``messages``; ``variables`` are the special tokens and the caller's
    template kwargs (kwargs win). Errors are one-line TokenizerErrors naming ``where``."""
    if tools is not None:
        for i, tool in enumerate(tools):
            if not isinstance(tool, Mapping):
                raise TokenizerError(f"tool {i} must be a JSON schema (a dict), not a "
                                     f"{type(tool).__name__}")
    if documents is not None:
        for i, doc in enumerate(documents):
            if not isinstance(doc, Mapping):
                raise TokenizerError(f"document {i} must be a dict with 'title' and 'text'")
    chat = prepare_messages(messages)
    try:
        return compile_template(source).render(
            messages=chat, tools=plain(list(tools)) if tools is not None else None,
            documents=plain(list(documents)) if documents is not None else None,
            add_generation_prompt=add_generation_prompt, **plain(dict(variables)))
    except jinja2.TemplateSyntaxError as exc:
        raise TokenizerError(f"{where}: the chat template does not compile (template line "
                             f"{exc.lineno}: {_one_line(exc.message or str(exc))})") from None
    except jinja2.TemplateError as exc:  # raise_exception(...) and undefined names land here
        raise TokenizerError(f"{where}: the chat template failed: "
                             f"{_one_line(str(exc))}") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise TokenizerError(f"{where}: the chat template failed on these messages: "
                             f"{type(exc).__name__}: {_one_line(str(exc))}") from None


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
