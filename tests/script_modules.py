"""Helpers any test file imports (``from script_modules import load_script``: tests/ is on
the path, where a ``conftest`` name would be whichever directory's conftest was imported
first): scripts outside any package (a bench, an example, a graph file) loaded as modules, and
the URL of a server that is down."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path
from types import ModuleType


def load_script(path: Path) -> ModuleType:
    """A script outside any package (a bench, an example, a graph file) as a module."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def nothing_listens(path: str) -> str:
    """``http://127.0.0.1:<port><path>`` on a loopback port nothing listens on (bound, then
    let go): a server that is down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}{path}"
