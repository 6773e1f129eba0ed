"""Run checkpoints: what ``pivotflow run --resume`` continues from.

``RUN/checkpoints/step-000040/`` holds the policy (a Hugging Face folder: safetensors, the
model's own config.json as the store holds it, and its tokenizer files, so it loads with
transformers' ``AutoModelForCausalLM`` and ``AutoTokenizer``), its AdamW state (``optimizer.safetensors``), the controller's state (``state.msgpack``:
ledger, prompt cursor and random states, every admitted-but-untrained sample) and, written
last, ``manifest.json``. Each is written into a temporary folder that is renamed into place
only when whole, then ``LATEST`` moves to it; so a controller killed at any moment — even
mid-write — leaves the previous checkpoint intact and loadable. Importing this module loads no
torch (``pivotflow run`` imports it before it needs any).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from pivotflow.controller.snapshot import ControllerState
from pivotflow.errors import CheckpointError, PivotflowError
from pivotflow.params.base import ParamStore
from pivotflow.params.hf_folder import read_folder, write_folder

if TYPE_CHECKING:
    import torch

KEEP = 2  # whole checkpoints kept; older ones are removed after a new one is in place


@dataclass(slots=True)
class Checkpoint:
    step: int
    path: Path
    policy_dir: Path
    optimizer: dict[str, torch.Tensor] | None
    state: ControllerState


def write(run_dir: Path, model: str, store: ParamStore, state: ControllerState, *,
          tokenizer_dir: Path | None = None) -> Path:
    """Checkpoint version ``state.version`` of ``model`` (taken from the store) with ``state``;
    the tokenizer and generation files in ``tokenizer_dir`` (the model's folder) go into the
    policy folder. Returns the checkpoint's folder. Raises CheckpointError if the store no
    longer has that version."""
    from safetensors.torch import save_file

    step = state.version
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    _, config, tensors = store.load(model, step)
    write_folder(tmp / "policy", config, tensors, side_files_from=tokenizer_dir)
    files = [f"policy/{p.name}" for p in sorted((tmp / "policy").iterdir())] + ["state.msgpack"]
    try:
        _, _, optim = store.load(f"{model}.optim", step)
    except PivotflowError:
        optim = None  # version 0: no optimizer step yet
    if optim is not None:
        save_file({k: v.contiguous() for k, v in optim.items()}, tmp / "optimizer.safetensors")
        files.append("optimizer.safetensors")
    (tmp / "state.msgpack").write_bytes(msgspec.msgpack.encode(state))
    manifest = {"step": step, "model": model, "files": files, "written_s": time.perf_counter()
                - t0, "samples_in_flight": len(state.samples)}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    pointer = root / f".LATEST.{os.getpid()}"
    pointer.write_text(final.name)
    os.replace(pointer, root / "LATEST")
    older = sorted(p for p in root.glob("step-*") if p.name < final.name)
    for old in older[: max(0, len(older) - (KEEP - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(run_dir: Path) -> Path | None:
    """The newest whole checkpoint of a run (None if it has none)."""
    root = run_dir / "checkpoints"
    named = (root / "LATEST").read_text().strip() if (root / "LATEST").exists() else ""
    candidates = [root / named] if named else []
    candidates += sorted(root.glob("step-*"), reverse=True) if root.exists() else []
    for path in candidates:
        if (path / "manifest.json").exists():
            return path
    return None


def read(path: Path) -> Checkpoint:
    """Load a checkpoint folder; raises CheckpointError naming what is missing or broken."""
    from safetensors.torch import load_file

    try:
        manifest = json.loads((path / "manifest.json").read_text())
        for name in manifest["files"]:
            if not (path / name).exists():
                raise CheckpointError(f"checkpoint {path}: {name} is missing")
        state = msgspec.msgpack.decode((path / "state.msgpack").read_bytes(),
                                       type=ControllerState)
        optim = (load_file(path / "optimizer.safetensors")
                 if "optimizer.safetensors" in manifest["files"] else None)
    except (OSError, ValueError, KeyError, msgspec.DecodeError) as exc:
        raise CheckpointError(f"checkpoint {path} is unreadable: {exc}") from exc
    return Checkpoint(int(manifest["step"]), path, path / "policy", optim, state)


def publish(ckpt: Checkpoint, model: str, store: ParamStore) -> None:
    """Put the checkpoint's policy and optimizer state into the store as its version, so
    workers and the first trainer pick them up as if the run had never stopped (with the
    config dict the checkpoint holds, which is the one the run published)."""
    config, tensors = read_folder(ckpt.policy_dir)
    store.publish(model, ckpt.step, tensors, config)
    if ckpt.optimizer is not None:
        store.publish(f"{model}.optim", ckpt.step, ckpt.optimizer, config)


def _fsync_dir(path: Path) -> None:
    for p in [*path.rglob("*"), path]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


__all__ = ["Checkpoint", "latest", "publish", "read", "write"]
