"""The control plane loads no torch: importing the CLI, controller, planner, simulator, run
driver, graph and tokenizer modules in a fresh interpreter leaves ``torch`` out of sys.modules
(torch alone takes seconds to import; ``pivotflow --help`` and ``pivotflow inspect`` must not
pay for it). Workers, engines and task training import torch when they run."""

from __future__ import annotations

import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pivotflow

ROOT = Path(pivotflow.__file__).parent
# Not yet torch-free, so not listed (issue 21 item 8 stays open for it): pivotflow.sim
# imports params/shm_store.py, which imports torch at module level.
PACKAGES = ("controller", "planner", "tokenizer")  # every module under these
MODULES = ("pivotflow.cli", "pivotflow.run", "pivotflow.run_models", "pivotflow.graph",
           "pivotflow.graph_check", "pivotflow.checkpoints", "pivotflow.params.base")

# Imports the module, then names the first pivotflow module on the stack that imported torch.
PROBE = """
import importlib, sys, traceback
culprit = []
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not culprit:
            culprit.extend(f"{f.filename}:{f.lineno}" for f in traceback.extract_stack()
                           if "pivotflow" in f.filename and "importlib" not in f.filename)
        return None
sys.meta_path.insert(0, Watch())
importlib.import_module(sys.argv[1])
print(" <- ".join(reversed(culprit)) if "torch" in sys.modules else "no torch")
"""


def control_plane_modules() -> list[str]:
    names = list(MODULES)
    for pkg in PACKAGES:
        names.append(f"pivotflow.{pkg}")
        names += [f"pivotflow.{pkg}.{m.name}" for m in pkgutil.iter_modules([str(ROOT / pkg)])]
    return names


@pytest.mark.parametrize("module", control_plane_modules())
def test_importing_loads_no_torch(module: str) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE, module], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "no torch", f"{module} imports torch via {out.stdout.strip()}"


def test_help_exits_zero() -> None:
    exe = shutil.which("pivotflow")
    cmd = [exe] if exe else [sys.executable, "-c", "import sys; from pivotflow.cli import main; "
                             "sys.exit(main())"]
    out = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "inspect" in out.stdout and "run" in out.stdout
