"""Scripts outside any package (a bench, an example, a graph file) loaded as modules, for any
test file to import (``from script_modules import load_script``: tests/ is on the path, where
a ``conftest`` name would be whichever directory's conftest was imported first)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_script(path: Path) -> ModuleType:
    """A script outside any package (a bench, an example, a graph file) as a module."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
