"""Where the bootstrapped models live, and the rules that keep that cache whole.

The package ships the models ``python -m pivotflow.tasks.bootstrap`` made for seed 0
(``pivotflow/tasks/data``), so a first run copies them instead of training for minutes; any other
seed, or a missing or damaged shipped copy, is trained here.

Each model is an ordinary Hugging Face model folder (``FILES``: the weights, config.json,
generation_config.json, the tokenizer's files and the chat template, plus the bootstrap's
meta.json), so ``AutoModelForCausalLM`` and ``AutoTokenizer`` load it as they load a Qwen's.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import platformdirs

from pivotflow.errors import CheckpointError

# bump when the bootstrap's models change, so old caches are not reused (v3: HF model folders
# with a byte-level BPE tokenizer; v2 had the character tokenizer)
FORMAT = "v3"
# Every built-in model folder holds these: what AutoModelForCausalLM and AutoTokenizer read, and
# the bootstrap's figures (meta.json)
FILES = ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
         "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "meta.json")
log = logging.getLogger("pivotflow.cache")


def cache_root() -> Path:
    """``$PIVOTFLOW_CACHE`` if set, else the user cache dir."""
    env = os.environ.get("PIVOTFLOW_CACHE")
    return Path(env) if env else Path(platformdirs.user_cache_dir("pivotflow"))


def models_dir(seed: int, quick: bool = False) -> Path:
    return cache_root() / f"models-{FORMAT}-seed{seed}{'-quick' if quick else ''}"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_files(folder: Path, what: str) -> None:
    """Raise CheckpointError if a checkpoint file under ``folder`` is missing or its JSON does
    not parse (``what`` names the cache in the message)."""
    for name in FILES:
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{what}: {path} is missing")
        if name.endswith(".json"):
            try:
                json.loads(path.read_text())
            except ValueError as exc:
                raise CheckpointError(f"{what}: {path} is not JSON ({exc})") from exc


def read_hashes(root: Path, what: str) -> dict:
    """``root/hashes.json`` (the recorded sha256 of each weights file); CheckpointError naming
    ``what`` cache when it is unreadable or not an object."""
    stamp = root / "hashes.json"
    try:
        hashes = json.loads(stamp.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{what} {stamp}: unreadable ({exc})") from exc
    if not isinstance(hashes, dict):
        raise CheckpointError(f"{what} {stamp}: unreadable (not a JSON object)")
    return hashes


def check_models(root: Path) -> None:
    """Raise CheckpointError naming the first missing or corrupt file under ``root``."""
    hashes = read_hashes(root, "model cache")
    for which in ("policy", "judge"):
        check_files(root / which, "model cache")
        weights = root / which / "model.safetensors"
        if _digest(weights) != hashes.get(which):
            raise CheckpointError(f"model cache: {weights} does not match its recorded hash")


def shipped_dir(seed: int) -> Path:
    """Models the package ships for ``seed`` (made by ``python -m pivotflow.tasks.bootstrap``)."""
    return Path(__file__).parent / "data" / f"models-{FORMAT}-seed{seed}"


def replace_dir(final: Path, fill: Callable[[Path], Any]) -> Any:
    """Run ``fill`` on a temp folder beside ``final``, then rename it into place (a reader
    sees the old folder or the whole new one, never a half-written one); returns its result."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        result = fill(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it owner-only; the cache is read by whoever runs
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_cached(root: Path, check: Callable[[Path], None], install: Callable[[], bool],
                  build: Callable[[], object], what: str) -> None:
    """Make ``root`` whole under its file lock (a second process waits, then finds it built):
    ``check`` it, else ``install`` a shipped copy, else ``build`` it; then check again."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            check(root)
        except CheckpointError as exc:
            if root.exists():
                log.warning("%s; rebuilding %s", exc, what)
            if not install():
                build()
            check(root)


def _install_shipped(seed: int) -> bool:
    """Copy the shipped models into the cache if there are whole ones for ``seed``."""
    src = shipped_dir(seed)
    try:
        check_models(src)
    except CheckpointError:
        return False
    replace_dir(models_dir(seed), lambda tmp: shutil.copytree(src, tmp, dirs_exist_ok=True))
    return True


def _build(seed: int, quick: bool, progress: bool) -> dict:
    from pivotflow.tasks.bootstrap import bootstrap

    def fill(tmp: Path) -> dict:
        figures = bootstrap(tmp, seed, quick=quick, progress=progress)
        figures["command"] = (f"python -m pivotflow.tasks.bootstrap --seed {seed}"
                              + (" --quick" if quick else ""))
        hashes = {w: _digest(tmp / w / "model.safetensors") for w in ("policy", "judge")}
        (tmp / "hashes.json").write_text(json.dumps(hashes))
        (tmp / "figures.json").write_text(json.dumps(figures, indent=2))
        return figures

    figures: dict = replace_dir(models_dir(seed, quick), fill)
    return figures


def ensure_models(seed: int = 0, *, progress: bool = True, quick: bool = False
                  ) -> tuple[Path, Path]:
    """The (policy, judge) checkpoint folders, bootstrapping them once if needed."""
    root = models_dir(seed, quick)
    ensure_cached(root, check_models, lambda: not quick and _install_shipped(seed),
                  lambda: _build(seed, quick, progress), "the models")
    return root / "policy", root / "judge"


def rebuild(seed: int = 0, *, quick: bool = False) -> dict:
    """Retrain and replace the cached models; returns the bootstrap's figures."""
    root = models_dir(seed, quick)
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(seed, quick, progress=True)
