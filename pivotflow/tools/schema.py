"""JSON Schemas from annotated Python signatures, and argument checks against them.

Only the part of JSON Schema that tool signatures produce is supported: ``type`` (one name or a
list), ``enum``, ``items``, ``properties``, ``required``, ``additionalProperties`` and ``anyOf``.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union

from pivotflow.errors import ToolCallError, ToolError

_SCALARS: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*$"
)


def type_schema(annotation: Any, where: str) -> dict[str, Any]:
    """The JSON Schema of one Python annotation.

    Raises ToolError (naming ``where``) for an annotation JSON cannot carry.
    """
    if annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}
    if annotation is type(None) or annotation is None:
        return {"type": "null"}
    if annotation is Any:
        return {}
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        parts = [type_schema(a, where) for a in args]
        if all(set(p) == {"type"} and isinstance(p["type"], str) for p in parts):
            return {"type": [p["type"] for p in parts]}
        return {"anyOf": parts}
    if annotation in (list, tuple) or origin in (list, tuple):
        item = args[0] if args and (origin is list or args[-1] is Ellipsis) else Any
        return {"type": "array", "items": type_schema(item, where)}
    if annotation is dict or origin is dict:
        if args and args[0] is not str:
            raise ToolError(f"{where}: dict keys must be str to be JSON, got {args[0]!r}")
        schema: dict[str, Any] = {"type": "object"}
        if args:
            schema["additionalProperties"] = type_schema(args[1], where)
        return schema
    raise ToolError(
        f"{where}: annotation {annotation!r} has no JSON Schema (use str, int, "
        "float, bool, list[...], dict[str, ...], Literal[...] or X | None)"
    )


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its description and ``{param: description}``."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    base: int | None = None  # indent of parameter lines; deeper lines continue the last one
    for line in lines:
        head = _SECTION.match(line)
        if head:
            section, current, base = head.group(1), None, None
            continue
        if section is None:
            description.append(line)
            continue
        if section not in ("Args", "Arguments", "Parameters") or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        m = _ARG_LINE.match(line.strip())
        if m and (base is None or indent <= base):
            base, current = indent, m.group(1).lstrip("*")
            params[current] = m.group(2).strip()
        elif current is not None:
            params[current] = (params[current] + " " + line.strip()).strip()
    text = "\n".join(description).strip()
    return " ".join(text.split("\n\n")[0].split()), params


def schema_from_function(
    fn: Callable[..., Any], name: str, doc: str | None = None
) -> tuple[str, dict[str, Any]]:
    """(description, parameters schema) of ``fn`` from its annotations and docstring
    (``doc`` if given, else ``fn``'s own).

    Raises ToolError when a parameter has no annotation, is positional-only or variadic.
    """
    try:
        hints = typing.get_type_hints(fn)
        sig = inspect.signature(fn)
    except (NameError, TypeError, ValueError) as exc:
        raise ToolError(f"tool {name!r}: cannot read the signature of {fn!r}: {exc}") from exc
    description, docs = parse_docstring(doc if doc is not None else inspect.getdoc(fn))
    props: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in sig.parameters.items():
        where = f"tool {name!r}, parameter {pname!r}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ToolError(
                f"{where}: tools take named JSON arguments; *args, **kwargs and "
                "positional-only parameters cannot be described"
            )
        if pname not in hints:
            raise ToolError(f"{where}: needs a type annotation to build its JSON Schema")
        prop = type_schema(hints[pname], where)
        if pname in docs:
            prop["description"] = docs[pname]
        if param.default is param.empty:
            required.append(pname)
        elif param.default is None or isinstance(param.default, (str, int, float, bool)):
            prop["default"] = param.default
        props[pname] = prop
    schema = {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }
    return description, schema


def _type_ok(value: Any, name: str) -> bool:
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    if name == "integer":
        if isinstance(value, float):
            return value.is_integer()
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if name == "string":
        return isinstance(value, str)
    if name == "array":
        return isinstance(value, list)
    if name == "object":
        return isinstance(value, dict)
    return False


def _describe(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"{type(value).__name__} {text}"


def check_value(value: Any, schema: Mapping[str, Any], where: str) -> None:
    """Check ``value`` against ``schema``; raise ToolCallError naming ``where`` if it does not fit."""
    if "anyOf" in schema:
        errors = []
        for option in schema["anyOf"]:
            try:
                check_value(value, option, where)
                return
            except ToolCallError as exc:
                errors.append(str(exc))
        raise ToolCallError(f"{where} fits none of the allowed types, got {_describe(value)}")
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(repr(v) for v in schema["enum"])
        raise ToolCallError(f"{where} must be one of {allowed}, got {_describe(value)}")
    kind = schema.get("type")
    if kind is not None:
        names = [kind] if isinstance(kind, str) else list(kind)
        if not any(_type_ok(value, n) for n in names):
            raise ToolCallError(f"{where} must be {' or '.join(names)}, got {_describe(value)}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            check_value(item, schema["items"], f"{where}[{i}]")
    if isinstance(value, dict) and (kind == "object" or "properties" in schema):
        check_object(value, schema, where)


def check_object(value: Mapping[str, Any], schema: Mapping[str, Any], where: str) -> None:
    """Check an object's required, known and extra keys, then each property's value."""
    props: Mapping[str, Any] = schema.get("properties", {})
    missing = [k for k in schema.get("required", []) if k not in value]
    if missing:
        raise ToolCallError(f"{where} is missing required argument(s): {', '.join(missing)}")
    extra_rule = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in props:
            check_value(item, props[key], f"{where} argument {key!r}")
        elif extra_rule is False:
            known = ", ".join(props) or "none"
            raise ToolCallError(f"{where} got unknown argument {key!r} (known: {known})")
        elif isinstance(extra_rule, Mapping):
            check_value(item, extra_rule, f"{where} argument {key!r}")
