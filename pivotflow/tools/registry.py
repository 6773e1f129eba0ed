"""Tools: Python callables with an OpenAI-style function schema, and a registry of them.

A tool is a module-level function (or a class with ``__call__``) with annotated parameters::

    @tool
    def calculator(expression: str) -> str:
        '''Evaluate an arithmetic expression.

        Args:
            expression: e.g. "12 * (3 + 4)".
        '''

Its schema is ``{"type": "function", "function": {"name", "description", "parameters"}}``.
The tool pool runs tools in other processes, which import them again by ``module:attr``; so a
tool must live at module level of an importable module (not in ``__main__`` or a function body).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, overload

from pivotflow.errors import ToolError
from pivotflow.tools.schema import check_object, schema_from_function


@dataclass(frozen=True, slots=True)
class Tool:
    """One tool: its name, description, JSON Schema of parameters, callable and import path."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any] = field(repr=False, compare=False)
    ref: str | None = (
        None  # "module:attr" a worker process imports to get ``fn`` (None: not importable)
    )
    # "python": a call's ``code`` argument runs as a program in the code sandbox
    # (``tools/code_interpreter.py``), not in a tool worker, which may not start processes
    sandbox: str | None = None

    def __call__(self, **arguments: Any) -> Any:
        """Run the tool in this process (the pool runs it in a sandboxed one)."""
        return self.fn(**arguments)

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema of this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def validate(self, arguments: Any) -> None:
        """Raise ToolCallError if ``arguments`` do not fit this tool's parameter schema."""
        from pivotflow.errors import ToolCallError

        if not isinstance(arguments, dict):
            raise ToolCallError(
                f"tool {self.name!r}: arguments must be a JSON object, got "
                f"{type(arguments).__name__}"
            )
        check_object(arguments, self.parameters, f"tool {self.name!r}:")


def _ref_of(obj: Any) -> str | None:
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<locals>" in qualname:
        return None
    return f"{module}:{qualname}"


def _make(obj: Any, name: str | None, description: str | None) -> Tool:
    if inspect.isclass(obj):
        cls: Any = obj
        try:
            instance = cls()
        except Exception as exc:
            raise ToolError(
                f"tool class {obj.__qualname__} must be constructible with no arguments: {exc}"
            ) from exc
        fn: Callable[..., Any] = instance.__call__
        tool_name = str(name or getattr(obj, "name", None) or obj.__name__)
        # the class's own docstring, else its __call__'s; never one inherited from object
        doc = vars(obj).get("__doc__") or getattr(vars(obj).get("__call__"), "__doc__", None)
        desc, params = schema_from_function(fn, tool_name, doc or "")
    elif callable(obj):
        fn, tool_name = obj, str(name or getattr(obj, "__name__", ""))
        desc, params = schema_from_function(fn, tool_name)
    else:
        raise ToolError(f"cannot make a tool from {obj!r}: need a function or a class")
    if not tool_name or not tool_name.replace("_", "a").replace("-", "a").isalnum():
        raise ToolError(f"tool name {tool_name!r} must be letters, digits, '_' or '-'")
    return Tool(
        tool_name, description if description is not None else desc, params, fn, _ref_of(obj)
    )


@overload
def tool(obj: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *, name: str | None = None, description: str | None = None
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    obj: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a Tool from a function or a no-argument class with ``__call__``.

    Use bare (``@tool``) or with overrides (``@tool(name="calc")``). The schema comes from the
    annotations, the description from the docstring's first paragraph and the per-parameter
    descriptions from its ``Args:`` section. Raises ToolError for a parameter JSON cannot carry.
    """
    if obj is not None:
        return _make(obj, name, description)
    return lambda fn: _make(fn, name, description)


class ToolRegistry:
    """Tools by name. ``load("pkg.mod:attr")`` adds tools named by import path."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, obj: Tool | Callable[..., Any], *, replace: bool = False) -> Tool:
        """Add a Tool (a plain function or class is wrapped with ``tool``); return it.

        Raises ToolError if a different tool of that name is already registered and not ``replace``.
        """
        t = obj if isinstance(obj, Tool) else tool(obj)
        old = self._tools.get(t.name)
        if old is not None and old is not t and not replace:
            raise ToolError(
                f"a tool named {t.name!r} is already registered ({old.ref or old.fn!r})"
            )
        self._tools[t.name] = t
        return t

    def get(self, name: str) -> Tool:
        """The tool called ``name``; raises ToolError naming the known tools if there is none."""
        try:
            return self._tools[name]
        except KeyError:
            known = ", ".join(sorted(self._tools)) or "none"
            raise ToolError(f"unknown tool {name!r}; available tools: {known}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        """Registered tool names, in the order they were added."""
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI-style function schemas of every tool, in the order they were added."""
        return [t.schema() for t in self._tools.values()]

    def load(self, path: str) -> list[Tool]:
        """Add the tools at ``path`` and return them.

        ``path`` is ``"pkg.mod:attr"`` (a Tool, a function, a tool class, a ToolRegistry or a
        list of these) or ``"pkg.mod"`` (every Tool defined at the module's top level).
        Raises ToolError naming the path if it cannot be imported or holds no tool.
        """
        added = [self.add(t) for t in load_tools(path)]
        return added


def _import(module_name: str, path: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except Exception as exc:
        raise ToolError(
            f"cannot import tool module {module_name!r} (from {path!r}): "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def resolve(path: str) -> Any:
    """The object a ``"pkg.mod:attr.sub"`` path names; raises ToolError if it does not exist."""
    module_name, _, attr = path.partition(":")
    if not module_name or (":" in path and not attr):
        raise ToolError(f"tool path {path!r} must look like 'pkg.module:attr' or 'pkg.module'")
    obj: Any = _import(module_name, path)
    for part in attr.split(".") if attr else []:
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ToolError(
                f"tool path {path!r}: {module_name!r} has no attribute {attr!r}"
            ) from None
    return obj


def load_tools(path: str) -> list[Tool]:
    """The Tools a ``module:attr`` or ``module`` path names (see ``ToolRegistry.load``)."""
    obj = resolve(path)
    if isinstance(obj, ModuleType):
        found = [v for v in vars(obj).values() if isinstance(v, Tool)]
    elif isinstance(obj, ToolRegistry):
        found = list(obj)
    elif isinstance(obj, (list, tuple)):
        found = [v if isinstance(v, Tool) else tool(v) for v in obj]
    elif isinstance(obj, Tool):
        found = [obj]
    elif callable(obj):
        found = [tool(obj)]
    else:
        raise ToolError(f"tool path {path!r} names a {type(obj).__name__}, not a tool")
    if not found:
        raise ToolError(f"tool path {path!r} holds no tools")
    return found


def callable_from_ref(ref: str) -> Callable[..., Any]:
    """What a worker process runs for the tool at ``ref``: a Tool's function, a tool class's
    fresh instance, or the plain function itself. Raises ToolError if it is none of these."""
    obj = resolve(ref)
    if isinstance(obj, Tool):
        return obj.fn
    if inspect.isclass(obj):
        cls: Any = obj
        instance: Callable[..., Any] = cls()
        return instance
    if callable(obj):
        return obj
    raise ToolError(f"tool path {ref!r} names a {type(obj).__name__}, not a tool")
