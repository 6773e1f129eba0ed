"""Where the bootstrapped models live, and the rules that keep that cache whole.

The package ships the models ``python -m pivotflow.tasks.bootstrap`` made for seed 0
(``pivotflow/tasks/data``), so a first run copies them instead of training for minutes; any other
seed, or a missing or damaged shipped copy, is trained here.

``cache_root()/models-<FORMAT>-seed<N>/{policy,judge}``, built once (under a file lock, so two
processes never both train), written to a temp folder and renamed into place, and checked on
every use: a missing file, unreadable JSON or a model file whose hash is not the one recorded
means a corrupt cache, which is reported and rebuilt.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import platformdirs

from pivotflow.errors import CheckpointError

FORMAT = "v1"  # bump when the bootstrap's models change, so old caches are not reused
FILES = ("model.safetensors", "config.json", "tokenizer.json", "meta.json")
log = logging.getLogger("pivotflow.cache")


def cache_root() -> Path:
    """``$PIVOTFLOW_CACHE`` if set, else the user cache dir."""
    env = os.environ.get("PIVOTFLOW_CACHE")
    return Path(env) if env else Path(platformdirs.user_cache_dir("pivotflow"))


def models_dir(seed: int, quick: bool = False) -> Path:
    return cache_root() / f"models-{FORMAT}-seed{seed}{'-quick' if quick else ''}"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_models(root: Path) -> None:
    """Raise CheckpointError naming the first missing or corrupt file under ``root``."""
    stamp = root / "hashes.json"
    try:
        hashes = json.loads(stamp.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"model cache {stamp}: unreadable ({exc})") from exc
    for which in ("policy", "judge"):
        for name in FILES:
            path = root / which / name
            if not path.is_file():
                raise CheckpointError(f"model cache: {path} is missing")
            if name.endswith(".json"):
                try:
                    json.loads(path.read_text())
                except ValueError as exc:
                    raise CheckpointError(f"model cache: {path} is not JSON ({exc})") from exc
        weights = root / which / "model.safetensors"
        if _digest(weights) != hashes.get(which):
            raise CheckpointError(f"model cache: {weights} does not match its recorded hash")


def shipped_dir(seed: int) -> Path:
    """Models the package ships for ``seed`` (made by ``python -m pivotflow.tasks.bootstrap``)."""
    return Path(__file__).parent / "data" / f"models-{FORMAT}-seed{seed}"


def _install_shipped(seed: int) -> bool:
    """Copy the shipped models into the cache if there are whole ones for ``seed``."""
    src = shipped_dir(seed)
    try:
        check_models(src)
    except CheckpointError:
        return False
    final = models_dir(seed)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def _build(seed: int, quick: bool, progress: bool) -> dict:
    from pivotflow.tasks.bootstrap import bootstrap

    final = models_dir(seed, quick)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        figures = bootstrap(tmp, seed, quick=quick, progress=progress)
        hashes = {w: _digest(tmp / w / "model.safetensors") for w in ("policy", "judge")}
        (tmp / "hashes.json").write_text(json.dumps(hashes))
        (tmp / "figures.json").write_text(json.dumps(figures, indent=2))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return figures
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_models(seed: int = 0, *, progress: bool = True, quick: bool = False
                  ) -> tuple[Path, Path]:
    """The (policy, judge) checkpoint folders, bootstrapping them once if needed."""
    root = models_dir(seed, quick)
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits, then finds the cache built
        try:
            check_models(root)
        except CheckpointError as exc:
            if root.exists():
                log.warning("%s; rebuilding the models", exc)
            if quick or not _install_shipped(seed):
                _build(seed, quick, progress)
            check_models(root)
    return root / "policy", root / "judge"


def rebuild(seed: int = 0, *, quick: bool = False) -> dict:
    """Retrain and replace the cached models; returns the bootstrap's figures."""
    root = models_dir(seed, quick)
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(seed, quick, progress=True)
