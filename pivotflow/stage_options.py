"""The checks of a stage's own arguments, made when the graph file declares the stage so a bad
one names its line: ``deadline_s``, ``on_error`` and ``concurrency`` for a stage of the graph's
own Python (``Graph.map``, ``group``, ``filter``, a judge's or reward model's template), a
generate stage's tool options, and the field names a stage writes. ``Graph`` (graph.py) calls
them; the controller reads their defaults."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

from pivotflow.errors import GraphError

TOOL_POOL_OPTIONS = frozenset({"workers", "timeout_s", "cpu_s", "memory_mb", "max_output_chars",
                               "max_argument_chars", "max_calls_per_worker", "net_namespace",
                               "isolation", "nproc", "file_size_mb", "open_files", "tmp_mb",
                               # (code_interpreter's programs on sandbox servers)
                               "sandbox_url", "sandbox_token"})
# How a stage's own Python may fail (controller/user_code.py): stop the run, or drop the group
ON_ERROR = ("stop", "skip")
DEFAULT_DEADLINE_S = 60.0  # generous: a stage function is per-sample Python, not a model call
# calls of one async stage function at once: enough to keep a reward server's batcher full
# (OpenRLHF sends a whole batch at once), few enough not to open a socket per sample of a
# large step
DEFAULT_CONCURRENCY = 64


def fault_options(kind: str, name: str, where: str, deadline_s: Any,
                  on_error: Any, concurrency: Any = None) -> dict[str, Any]:
    """A stage's ``deadline_s`` (seconds a call of its function may take; None: run inline,
    no deadline), ``on_error`` and, for a stage of the graph's own Python, ``concurrency``
    (calls of an ``async def`` function at once), checked now so a bad one names the graph
    file's line."""
    here = f"{kind} {name!r} at {where}"
    if deadline_s is not None and (isinstance(deadline_s, bool)
                                   or not isinstance(deadline_s, (int, float))
                                   or not deadline_s > 0):
        raise GraphError(f"{here}: deadline_s must be a number of seconds > 0 or None, got "
                         f"{deadline_s!r}")
    if on_error not in ON_ERROR:
        raise GraphError(f"{here}: on_error must be one of {list(ON_ERROR)}, got {on_error!r}")
    options = {"deadline_s": None if deadline_s is None else float(deadline_s),
               "on_error": on_error}
    if concurrency is not None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise GraphError(f"{here}: concurrency must be a whole number >= 1, got "
                             f"{concurrency!r}")
        options["concurrency"] = concurrency
    return options


def tool_options(node: str, where: str, tools: Iterable[Any], max_turns: int, parser: str,
                 max_total_tokens: int | None, pool: dict[str, Any]) -> dict[str, Any]:
    """Check a generate stage's tool options now, so a bad one names the graph file's line."""
    from pivotflow.errors import PivotflowError
    from pivotflow.tools.parsers import PARSERS
    from pivotflow.tools.registry import ToolRegistry

    here = f"generate {node!r} at {where}"
    registry = ToolRegistry()
    try:
        # a string is a comma-separated list of paths (what --set graph.tools=... gives)
        for t in tools.split(",") if isinstance(tools, str) else list(tools):
            if isinstance(t, str):
                registry.load(t.strip())
            else:
                registry.add(t)
    except PivotflowError as exc:
        raise GraphError(f"{here}: {exc}") from None
    if not len(registry):
        raise GraphError(f"{here}: tools= names no tool")
    if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
        raise GraphError(f"{here}: max_turns must be an int >= 1, got {max_turns!r}")
    if parser not in PARSERS:
        raise GraphError(f"{here}: unknown tool_parser {parser!r}; known: {sorted(PARSERS)}")
    if parser == "python_block" and "code_interpreter" not in registry:
        raise GraphError(f"{here}: tool_parser 'python_block' calls the code_interpreter tool; "
                         "add pivotflow.tools.code_interpreter:code_interpreter to tools=")
    if max_total_tokens is not None and (not isinstance(max_total_tokens, int)
                                         or max_total_tokens < 1):
        raise GraphError(f"{here}: max_total_tokens must be an int >= 1, got "
                         f"{max_total_tokens!r}")
    bad = sorted(set(pool) - TOOL_POOL_OPTIONS)
    if bad:
        raise GraphError(f"{here}: unknown tool_pool options {bad}; known: "
                         f"{sorted(TOOL_POOL_OPTIONS)}")
    return {"tools": registry, "max_turns": max_turns, "tool_parser": parser,
            "max_total_tokens": max_total_tokens, "tool_pool": dict(pool)}



def field_names(writes: Iterable[str], where: str, stage: str) -> frozenset[str]:
    """``writes`` as a set; names starting with "_" are the controller's own (its per-sample
    state, never passed to stage functions), so a stage may not write one."""
    names = frozenset(writes)
    reserved = sorted(repr(n) for n in names if not isinstance(n, str) or n.startswith("_"))
    if reserved:
        raise GraphError(f"stage {stage!r} at {where}: field names {', '.join(reserved)} are "
                         "not allowed (names starting with '_' are the controller's own)")
    return names


def reads_fields(*names: str) -> inspect.Signature:
    """The signature ``(name, ...)`` a built-in stage function made by a factory
    (``code_reward("tests")``) shows the graph, so the graph checks the fields it reads along
    its edges, though its own takes ``**fields``."""
    keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Signature([inspect.Parameter(name, keyword) for name in names])
