"""Tools as a user's graph module would hold them; the run-folder test copies this file into a
project folder (next to a ``runs/`` folder) and imports it from there."""

from __future__ import annotations

import os

from pivotflow.tools import tool


@tool
def peek(path: str) -> str:
    """Read a file or list a folder; the outcome."""
    try:
        return str(os.listdir(path) if os.path.isdir(path) else open(path).read())
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


@tool
def poke(path: str) -> str:
    """Append to a file; the outcome."""
    try:
        with open(path, "a") as f:
            return str(f.write("x"))
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
