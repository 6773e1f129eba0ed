"""Tool schemas from signatures and docstrings; argument checks; the registry and its loader."""

from __future__ import annotations

from typing import Literal

import pytest

from pivotflow.errors import ToolCallError, ToolError
from pivotflow.tools import Tool, ToolRegistry, load_tools, tool
from pivotflow.tools.builtin import calculator


@tool
def search(
    query: str,
    k: int = 3,
    mode: Literal["fast", "exact"] = "fast",
    tags: list[str] | None = None,
    weights: dict[str, float] | None = None,
) -> str:
    """Search the notes.

    Longer explanation that is not part of the description.

    Args:
        query: what to look for,
            over two lines.
        k (int): how many hits.
        mode: how hard to look.
    Returns:
        The hits.
    """
    return query


def test_schema_from_signature_and_docstring() -> None:
    assert search.schema() == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the notes.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "what to look for, over two lines."},
                    "k": {"type": "integer", "description": "how many hits.", "default": 3},
                    "mode": {
                        "enum": ["fast", "exact"],
                        "description": "how hard to look.",
                        "default": "fast",
                    },
                    "tags": {
                        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                        "default": None,
                    },
                    "weights": {
                        "anyOf": [
                            {"type": "object", "additionalProperties": {"type": "number"}},
                            {"type": "null"},
                        ],
                        "default": None,
                    },
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    }
    assert search(query="q") == "q"


def test_overrides_and_class_tools() -> None:
    @tool(name="calc2", description="Adds.")
    def add(a: int, b: float | None = None) -> float:
        return a + (b or 0)

    assert add.name == "calc2" and add.description == "Adds."
    assert add.parameters["properties"]["b"] == {"type": ["number", "null"], "default": None}
    assert add.ref is None  # defined in a function: the pool cannot import it

    class Box:
        """Keep a number."""

        name = "box"

        def __call__(self, value: int) -> int:
            return value

    t = tool(Box)
    assert (t.name, t.description, t.parameters["required"]) == ("box", "Keep a number.", ["value"])


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"query": 1}, "argument 'query' must be string, got int 1"),
        ({"query": "q", "k": True}, "argument 'k' must be integer, got bool True"),
        ({"query": "q", "k": 1.5}, "argument 'k' must be integer, got float 1.5"),
        ({"query": "q", "mode": "slow"}, "argument 'mode' must be one of 'fast', 'exact', got str"),
        ({"query": "q", "tags": ["a", 2]}, r"argument 'tags' fits none of the allowed types"),
        ({"query": "q", "weights": {"a": "x"}}, "argument 'weights' fits none"),
        ({"k": 1}, "missing required argument"),
        ({"query": "q", "extra": 1}, "unknown argument 'extra' \\(known: query, k, mode, tags"),
        (["q"], "arguments must be a JSON object, got list"),
    ],
)
def test_validation_errors(args: object, match: str) -> None:
    with pytest.raises(ToolCallError, match=match):
        search.validate(args)


def test_validation_accepts_good_arguments() -> None:
    search.validate({"query": "q", "k": 2.0, "tags": ["a"], "weights": {"a": 1}, "mode": "exact"})


@pytest.mark.parametrize(
    ("fn_src", "match"),
    [
        ("def f(x): pass", "needs a type annotation"),
        ("def f(*args: int): pass", "cannot be described"),
        ("def f(x: set): pass", "has no JSON Schema"),
        ("def f(x: dict[int, str]): pass", "dict keys must be str"),
    ],
)
def test_bad_definitions(fn_src: str, match: str) -> None:
    namespace: dict[str, object] = {}
    exec(fn_src, namespace)
    with pytest.raises(ToolError, match=match):
        tool(namespace["f"])  # type: ignore[arg-type]


def test_registry_add_get_schemas() -> None:
    registry = ToolRegistry([calculator, search])
    assert registry.names == ["calculator", "search"]
    assert registry.get("search") is search
    assert [s["function"]["name"] for s in registry.schemas()] == ["calculator", "search"]
    with pytest.raises(ToolError, match="unknown tool 'nope'; available tools: calculator, search"):
        registry.get("nope")
    with pytest.raises(ToolError, match="already registered"):
        registry.add(_other_search())
    registry.add(calculator)  # the same tool again is fine


def _other_search() -> Tool:
    def search(query: str) -> str:
        return query

    return tool(search)


def test_load_paths() -> None:
    registry = ToolRegistry()
    assert [t.name for t in registry.load("pivotflow.tools.builtin:calculator")] == ["calculator"]
    assert [t.name for t in load_tools("pivotflow.tools.builtin")] == ["calculator"]
    assert calculator.ref == "pivotflow.tools.builtin:calculator"
    assert [t.name for t in load_tools("test_tool_registry:search")] == ["search"]


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("no_such_module_xyz:f", "cannot import tool module 'no_such_module_xyz'"),
        ("pivotflow.tools.builtin:nothing", "has no attribute 'nothing'"),
        ("pivotflow.tools.builtin:MAX_EXPONENT", "names a int, not a tool"),
        ("pivotflow.errors", "holds no tools"),
        (":f", "must look like"),
    ],
)
def test_load_errors(path: str, match: str) -> None:
    with pytest.raises(ToolError, match=match):
        ToolRegistry().load(path)
