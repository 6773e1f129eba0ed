"""Where ``builtin:tool_policy`` lives, under the same rules as the other built-in models.

``cache_root()/tool-policy-<FORMAT>-seed<N>/`` holds one Hugging Face model folder (the
files of ``cache.FILES``: weights, configs, the tokenizer's files, meta.json) and
``hashes.json``. It is built once under a file lock,
written to a temp folder and renamed into place, and checked on every use: a missing file,
unreadable JSON or weights whose hash is not the recorded one mean a corrupt cache, which is
reported and rebuilt. The package ships the seed-0 build (``pivotflow/tasks/data``), so a first
use copies it instead of training.
"""

from __future__ import annotations

import fcntl
import json
import shutil
from pathlib import Path
from typing import Any

from pivotflow.errors import CheckpointError
from pivotflow.tasks.cache import (
    FORMAT,
    _digest,
    cache_root,
    check_files,
    ensure_cached,
    read_hashes,
    replace_dir,
)

WEIGHTS = "model.safetensors"


def tool_policy_dir(seed: int) -> Path:
    """The cached tool policy checkpoint folder for ``seed`` (whole or not)."""
    return cache_root() / f"tool-policy-{FORMAT}-seed{seed}"


def shipped_tool_policy(seed: int) -> Path:
    """The tool policy the package ships for ``seed`` (made by ``python -m
    pivotflow.tasks.tool_policy --out``)."""
    return Path(__file__).parent / "data" / f"tool-policy-{FORMAT}-seed{seed}"


def check_tool_policy(root: Path) -> None:
    """Raise CheckpointError naming the first missing or corrupt file under ``root``."""
    hashes = read_hashes(root, "tool policy cache")
    check_files(root, "tool policy cache")
    if _digest(root / WEIGHTS) != hashes.get(WEIGHTS):
        raise CheckpointError(
            f"tool policy cache: {root / WEIGHTS} does not match its recorded hash"
        )


def write_tool_policy(model: Any, tok: Any, out: Path, meta: dict) -> None:
    """Save ``model`` (a Decoder) and its tokenizer with ``meta`` as a whole model folder at
    ``out``."""
    from pivotflow.tasks.bootstrap import save_model

    save_model(model, tok, out, meta)
    (out / "hashes.json").write_text(json.dumps({WEIGHTS: _digest(out / WEIGHTS)}))


def _install_shipped(seed: int, final: Path) -> bool:
    """Copy the shipped tool policy into ``final`` if there is a whole one for ``seed``."""
    src = shipped_tool_policy(seed)
    try:
        check_tool_policy(src)
    except CheckpointError:
        return False
    replace_dir(final, lambda tmp: shutil.copytree(src, tmp, dirs_exist_ok=True))
    return True


def _build(seed: int, final: Path, progress: bool) -> dict:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from pivotflow.tasks.tool_policy import train_tool_policy

    with Progress(
        SpinnerColumn(),
        TextColumn("tool policy {task.fields[status]}"),
        TimeElapsedColumn(),
        disable=not progress,
    ) as bar:
        task = bar.add_task("tool_policy", total=None, status="training")

        def report(figs: dict) -> None:
            bar.update(
                task,
                status=" ".join(
                    f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in figs.items()
                    if k in ("phase", "step", "tool_rate", "tool_accuracy", "direct_accuracy")
                ),
            )

        model, tok, figures = train_tool_policy(seed, False, report)
    meta = {**figures, "command": f"python -m pivotflow.tasks.tool_policy --seed {seed}"}
    replace_dir(final, lambda tmp: write_tool_policy(model, tok, tmp, meta))
    return meta


def ensure_tool_policy(seed: int = 0, *, progress: bool = True) -> Path:
    """The tool policy checkpoint folder for ``seed``: checked, else copied from the shipped
    build, else trained (once, under a lock). Raises CheckpointError if the result is not whole,
    PivotflowError if training misses its targets."""
    root = tool_policy_dir(seed)
    ensure_cached(root, check_tool_policy, lambda: _install_shipped(seed, root),
                  lambda: _build(seed, root, progress), "the tool policy")
    return root


def rebuild_tool_policy(seed: int = 0, *, out: Path | None = None, progress: bool = True) -> dict:
    """Retrain the tool policy into ``out`` (default: replace the cached one); returns its
    figures. Raises PivotflowError if training misses its targets."""
    if out is not None:  # no lock file left beside a folder the user named
        return _build(seed, out, progress)
    final = tool_policy_dir(seed)
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(seed, final, progress)
