"""Tools for agentic RL: definitions and schemas, call parsers, and a sandboxed process pool."""

from __future__ import annotations

from pivotflow.tools.parsers import HermesParser, ToolCall, ToolCallParser, ToolCallWatcher
from pivotflow.tools.pool import ToolPool, ToolResult
from pivotflow.tools.registry import Tool, ToolRegistry, load_tools, tool

__all__ = [
    "HermesParser",
    "Tool",
    "ToolCall",
    "ToolCallParser",
    "ToolCallWatcher",
    "ToolPool",
    "ToolRegistry",
    "ToolResult",
    "load_tools",
    "tool",
]
