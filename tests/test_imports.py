"""The control plane loads no torch: importing the CLI, controller, planner, simulator, run
driver, graph and tokenizer modules in a fresh interpreter leaves ``torch`` out of sys.modules
(torch alone takes seconds to import; ``pivotflow --help`` and ``pivotflow inspect`` must not
pay for it), and so do ``pivotflow --help`` and ``pivotflow inspect`` of every shipped graph,
which also leave out networkx (~0.6 s; only the report of a cycle needs it). Workers, engines
and task training import torch when they run."""

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
PACKAGES = ("controller", "planner", "sim", "tokenizer")  # every module under these
# pivotflow.rl itself loads its tensor math on first use; graph files import group_fns.
MODULES = ("pivotflow.cli", "pivotflow.run", "pivotflow.run_models", "pivotflow.graph",
           "pivotflow.graph_check", "pivotflow.checkpoints", "pivotflow.params.base",
           "pivotflow.rl", "pivotflow.rl.group_fns", "pivotflow.rl.list_math")
GRAPHS = sorted((ROOT.parent / "graphs").glob("*.py"))

# Watches for imports of the modules named in argv[1] (comma-separated), runs argv[2:] (a
# module to import, or "cli" and the command line's arguments), then prints on its last line
# either "none" or, per module loaded, the pivotflow frames on the stack that imported it.
PROBE = """
import contextlib, importlib, io, sys, traceback
watched, culprit = sys.argv[1].split(","), {}
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name in watched and name not in culprit:
            culprit[name] = " <- ".join(reversed([
                f"{f.filename}:{f.lineno}" for f in traceback.extract_stack()
                if "pivotflow" in f.filename and "importlib" not in f.filename]))
        return None
sys.meta_path.insert(0, Watch())
if sys.argv[2] == "cli":
    from pivotflow.cli import main
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        rc = main(sys.argv[3:])
        assert rc == 0, f"exit status {rc}"
else:
    importlib.import_module(sys.argv[2])
loaded = [m for m in watched if m in sys.modules]
print("; ".join(f"{m} via {culprit.get(m) or '?'}" for m in loaded) if loaded else "none")
"""


def probe(watched: tuple[str, ...], *args: str) -> str:
    """What PROBE prints on its last line, run in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", PROBE, ",".join(watched), *args],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def control_plane_modules() -> list[str]:
    names = list(MODULES)
    for pkg in PACKAGES:
        names.append(f"pivotflow.{pkg}")
        names += [f"pivotflow.{pkg}.{m.name}" for m in pkgutil.iter_modules([str(ROOT / pkg)])]
    return names


@pytest.mark.parametrize("module", control_plane_modules())
def test_importing_loads_no_torch(module: str) -> None:
    loaded = probe(("torch",), module)
    assert loaded == "none", f"{module} imports {loaded}"


@pytest.mark.parametrize("argv", [["--help"]] + [["inspect", str(g)] for g in GRAPHS],
                         ids=lambda argv: " ".join(Path(a).name for a in argv))
def test_help_and_inspect_load_no_torch_nor_networkx(argv: list[str]) -> None:
    loaded = probe(("torch", "networkx"), "cli", *argv)
    assert loaded == "none", f"pivotflow {' '.join(argv)} imports {loaded}"


def test_every_shipped_graph_is_inspected() -> None:
    assert {g.name for g in GRAPHS} >= {"grpo_genrm.py", "grpo_rule.py", "agentic_tools.py",
                                        "grpo_genrm_longtail.py"}


def test_help_exits_zero() -> None:
    exe = shutil.which("pivotflow")
    cmd = [exe] if exe else [sys.executable, "-c", "import sys; from pivotflow.cli import main; "
                             "sys.exit(main())"]
    out = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "inspect" in out.stdout and "run" in out.stdout
