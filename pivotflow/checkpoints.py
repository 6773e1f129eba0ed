"""Run checkpoints: what ``pivotflow run --resume`` continues from.

``RUN/checkpoints/step-000040/`` holds the policy (a Hugging Face folder: safetensors, the
model's own config.json as the store holds it, and its tokenizer files, so it loads with
transformers' ``AutoModelForCausalLM`` and ``AutoTokenizer``), its AdamW state
(``optimizer.safetensors``; under LoRA the adapters too, and ``adapter/`` holds them as PEFT
saves them; with a critic, ``critic/``, a Hugging Face classifier folder, and its AdamW state
``critic_optimizer.safetensors``), the controller's state (``state.msgpack``: ledger, prompt
cursor and random states, every admitted-but-untrained sample) and, written last,
``manifest.json``, which lists every file with its SHA-256. Each is written into a temporary
folder that is renamed into place only when whole, then ``LATEST`` moves to it; so a controller
killed at any moment — even mid-write — leaves the previous checkpoint intact and loadable, and
a write that fails (a full disk) removes its temporary folder and says so in one line. A resume
verifies every checksum and that the manifest, the folder's name and the controller state agree
on the step before it uses a checkpoint (``newest_whole``); a damaged one is passed over for the
one before it, and the reason is returned so the run can say so.
Importing this module loads no torch (``pivotflow run`` imports it before it needs any).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from pivotflow.controller.snapshot import ControllerState
from pivotflow.errors import CheckpointError, PivotflowError
from pivotflow.params.base import ParamStore
from pivotflow.params.hf_folder import read_folder, read_json, write_folder

if TYPE_CHECKING:
    import torch

KEEP = 2  # whole checkpoints kept; older ones are removed after a new one is in place
CHECKSUM = "sha256"  # hashlib name; `sha256sum` checks the same digests from a shell


@dataclass(slots=True)
class Checkpoint:
    step: int
    path: Path
    policy_dir: Path
    optimizer: dict[str, torch.Tensor] | None
    state: ControllerState
    critic_dir: Path | None = None  # PPO's value model, when the run trains one
    critic_optimizer: dict[str, torch.Tensor] | None = None


def write(run_dir: Path, model: str, store: ParamStore, state: ControllerState, *,
          tokenizer_dir: Path | None = None, lora: LoraExport | None = None,
          critic: tuple[str, Path | None] | None = None) -> Path:
    """Checkpoint version ``state.version`` of ``model`` (taken from the store) with ``state``;
    the tokenizer and generation files in ``tokenizer_dir`` (the model's folder) go into the
    policy folder. Under LoRA (``lora``) the adapters also go into ``adapter/`` as PEFT saves
    them. ``critic``: the critic's store name and folder, whose version goes into ``critic/``
    with its optimizer state. Returns the checkpoint's folder. Raises CheckpointError if the
    store no longer has that version, or (one line, naming the folder) if the files cannot be
    written: the temporary folder is removed and the previous checkpoints are left as they
    were."""
    step = state.version
    root = run_dir / "checkpoints"
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        sweep_temporary(run_dir)
        shutil.rmtree(tmp, ignore_errors=True)
        _write_into(tmp, model, store, state, tokenizer_dir, lora, critic)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        pointer = root / f".LATEST.{os.getpid()}"
        pointer.write_text(final.name)
        os.replace(pointer, root / "LATEST")
    except OSError as exc:  # a full disk, a read-only folder: nothing half-written stays
        shutil.rmtree(tmp, ignore_errors=True)
        (root / f".LATEST.{os.getpid()}").unlink(missing_ok=True)
        raise CheckpointError(f"cannot write checkpoint {final}: "
                              f"{exc.strerror or exc}") from exc
    older = sorted(p for p in root.glob("step-*") if p.name < final.name)
    for old in older[: max(0, len(older) - (KEEP - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _write_into(tmp: Path, model: str, store: ParamStore, state: ControllerState,
                tokenizer_dir: Path | None, lora: LoraExport | None,
                critic: tuple[str, Path | None] | None) -> None:
    t0 = time.perf_counter()
    step = state.version
    files = _write_model(tmp, "policy", model, step, store, tokenizer_dir) + ["state.msgpack"]
    optim = _optim_at(store, model, step)
    if optim is not None:
        _save_tensors(optim, tmp / "optimizer.safetensors")
        files.append("optimizer.safetensors")
        if lora is not None:
            files += _write_adapter(tmp / "adapter", optim, lora)
    if critic is not None:
        files += _write_model(tmp, "critic", critic[0], step, store, critic[1])
        critic_optim = _optim_at(store, critic[0], step)
        if critic_optim is not None:
            _save_tensors(critic_optim, tmp / "critic_optimizer.safetensors")
            files.append("critic_optimizer.safetensors")
    (tmp / "state.msgpack").write_bytes(msgspec.msgpack.encode(state))
    t1 = time.perf_counter()
    sums = {name: file_digest(tmp / name) for name in files}
    manifest = {"step": step, "model": model, "files": files, "written_s": time.perf_counter()
                - t0, "samples_in_flight": len(state.samples), "checksum": CHECKSUM,
                "checksums": sums, "checksum_s": time.perf_counter() - t1}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    _fsync_dir(tmp)


def _write_model(tmp: Path, folder: str, model: str, step: int, store: ParamStore,
                 side_files_from: Path | None) -> list[str]:
    """Version ``step`` of ``model`` as a Hugging Face folder ``tmp/folder``; its files."""
    from safetensors import SafetensorError

    _, config, tensors = store.load(model, step)
    try:
        write_folder(tmp / folder, config, tensors, side_files_from=side_files_from)
    except CheckpointError as exc:  # its own one-line error; the cause is an OSError
        if isinstance(exc.__cause__, OSError):
            raise exc.__cause__ from None
        raise
    except SafetensorError as exc:  # how safetensors reports a failed write (a full disk)
        raise OSError(str(exc)) from exc
    return [f"{folder}/{p.name}" for p in sorted((tmp / folder).iterdir())]


def _optim_at(store: ParamStore, model: str, step: int) -> Mapping[str, torch.Tensor] | None:
    from pivotflow.params.optim_entries import load_optim_state

    try:  # (whole, or joined from the trainers' shards; no wait: the step is reported done)
        return load_optim_state(store, model, step, wait_s=0)
    except PivotflowError:
        return None  # version 0: no optimizer step yet


@dataclass(frozen=True)
class LoraExport:
    """What PEFT's adapter_config.json needs beside the adapters: their scale, the layers they
    adapt, and the folder of the model they apply to (the policy before training)."""

    alpha: float
    targets: list[str]
    base_model: str
    model_config: dict[str, Any]  # the base's config.json ({} when unknown): its file's layout


def lora_export(train_options: dict[str, Any], base_model: Path | None) -> LoraExport | None:
    """What a run's checkpoints write its adapters with, from its train stage's options (None
    without LoRA)."""
    from pivotflow.worker.train_config import train_config

    tc = train_config(train_options)
    if not tc.lora_rank:
        return None
    config = read_json(base_model / "config.json") if base_model is not None else {}
    return LoraExport(tc.lora_alpha, list(tc.lora_target_modules), str(base_model or ""), config)


def _write_adapter(folder: Path, optim: Mapping[str, torch.Tensor],
                   lora: LoraExport) -> list[str]:
    """The optimizer state's adapters (``worker/lora.py``) as a PEFT adapter folder; returns
    the files written, relative to the checkpoint."""
    from pivotflow.worker.lora import ADAPTER_SUFFIXES, peft_adapter

    adapters = {k: optim[k] for k in optim if k.endswith(ADAPTER_SUFFIXES)}  # (reads no other)
    tensors, config = peft_adapter(adapters, alpha=lora.alpha, targets=lora.targets,
                                   base_model=lora.base_model, model_config=lora.model_config)
    folder.mkdir()
    _save_tensors(tensors, folder / "adapter_model.safetensors")
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return ["adapter/adapter_config.json", "adapter/adapter_model.safetensors"]


def _save_tensors(tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    """``tensors`` as one safetensors file, written one tensor at a time (a sharded optimizer
    state is joined entry by entry as it is written: nobody holds it whole); a failed write (a
    full disk) is an OSError, which ``write`` turns into its one-line error."""
    from pivotflow.params.safetensors_stream import save_streamed

    try:
        save_streamed(tensors, path)
    except (RuntimeError, ValueError) as exc:
        raise OSError(str(exc)) from exc


def file_digest(path: Path) -> str:
    """The file's CHECKSUM digest, read in 1 MiB blocks (a policy may be gigabytes)."""
    h = hashlib.new(CHECKSUM)
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def sweep_temporary(run_dir: Path) -> list[Path]:
    """Remove what a write killed midway left: ``.tmp-*-PID`` and ``.old-*-PID`` folders and
    ``.LATEST.PID`` files whose process is gone (another live controller's are left alone)."""
    root = run_dir / "checkpoints"
    removed = []
    for path in [*root.glob(".tmp-*"), *root.glob(".old-*"), *root.glob(".LATEST.*")]:
        pid = path.name.rsplit("." if path.name.startswith(".LATEST") else "-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
            continue
        kept = root / path.name.removeprefix(".old-").rsplit("-", 1)[0]
        if path.name.startswith(".old-") and not kept.exists():
            os.rename(path, kept)  # killed between its two renames: the only copy
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: alive
    return True


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


def newest_whole(run_dir: Path) -> tuple[Checkpoint | None, list[str]]:
    """The newest checkpoint that passes ``read`` (checksums, step), and why each newer one
    was passed over (empty when the newest is whole). (None, []) for a run without any;
    raises CheckpointError, listing each one's fault, when every checkpoint is damaged."""
    root = run_dir / "checkpoints"
    named = (root / "LATEST").read_text().strip() if (root / "LATEST").is_file() else ""
    candidates = [root / named] if named and (root / named).is_dir() else []
    candidates += [p for p in sorted(root.glob("step-*"), reverse=True) if p not in candidates]
    rejected: list[str] = []
    for path in candidates:
        if not (path / "manifest.json").exists():
            continue  # a write cut short before its manifest: never a checkpoint
        try:
            return read(path), rejected
        except CheckpointError as exc:
            rejected.append(str(exc))
    if rejected:
        raise CheckpointError(f"no whole checkpoint under {root}: {'; '.join(rejected)}")
    return None, []


def read(path: Path) -> Checkpoint:
    """Load a checkpoint folder after checking it: every file the manifest lists is there
    with its checksum (a manifest from before checksums is checked for presence only), and
    the manifest, the folder name and the controller state name the same step. Raises
    CheckpointError naming the folder and what is missing, damaged or inconsistent."""
    from safetensors.torch import load_file

    try:
        manifest = json.loads((path / "manifest.json").read_text())
        sums = manifest.get("checksums", {})
        for name in manifest["files"]:
            if not (path / name).exists():
                raise CheckpointError(f"checkpoint {path}: {name} is missing")
            if name in sums and file_digest(path / name) != sums[name]:
                raise CheckpointError(f"checkpoint {path}: {name} is damaged (its "
                                      f"{manifest.get('checksum', CHECKSUM)} does not match "
                                      "the manifest's)")
        state = msgspec.msgpack.decode((path / "state.msgpack").read_bytes(),
                                       type=ControllerState)
        optim = (load_file(path / "optimizer.safetensors")
                 if "optimizer.safetensors" in manifest["files"] else None)
        critic_optim = (load_file(path / "critic_optimizer.safetensors")
                        if "critic_optimizer.safetensors" in manifest["files"] else None)
        has_critic = any(name.startswith("critic/") for name in manifest["files"])
        step = int(manifest["step"])
    except (OSError, ValueError, KeyError, TypeError, msgspec.DecodeError) as exc:
        raise CheckpointError(f"checkpoint {path} is unreadable: {exc}") from exc
    named = path.name.removeprefix("step-")
    if state.version != step or (named.isdigit() and int(named) != step):
        raise CheckpointError(f"checkpoint {path}: its manifest says step {step}, its "
                              f"controller state version {state.version}: they must agree")
    return Checkpoint(step, path, path / "policy", optim, state,
                      path / "critic" if has_critic else None, critic_optim)


def publish(ckpt: Checkpoint, model: str, store: ParamStore, critic: str | None = None) -> None:
    """Put the checkpoint's policy and optimizer state into the store as its version, so
    workers and the first trainer pick them up as if the run had never stopped (with the
    config dict the checkpoint holds, which is the one the run published); with ``critic``
    (the run's critic model) the critic's too, which the checkpoint must then hold."""
    config, tensors = read_folder(ckpt.policy_dir)
    store.publish(model, ckpt.step, tensors, config)
    if ckpt.optimizer is not None:
        store.publish(f"{model}.optim", ckpt.step, ckpt.optimizer, config)
    if critic is not None:
        if ckpt.critic_dir is None:
            raise CheckpointError(f"checkpoint {ckpt.path} holds no critic/ folder, and this "
                                  f"run's graph trains critic {critic!r}")
        critic_config, critic_tensors = read_folder(ckpt.critic_dir)
        store.publish(critic, ckpt.step, critic_tensors, critic_config)
        if ckpt.critic_optimizer is not None:
            store.publish(f"{critic}.optim", ckpt.step, ckpt.critic_optimizer, critic_config)
    # workers ask the store for the controller's version: a disagreement would have them
    # ask, fail and restart forever, so it is an error here, before any of them starts
    if store.latest(model) != ckpt.state.version:
        raise CheckpointError(f"checkpoint {ckpt.path}: the store holds {model} version "
                              f"{store.latest(model)}, the controller state resumes at "
                              f"{ckpt.state.version}")


def _fsync_dir(path: Path) -> None:
    for p in [*path.rglob("*"), path]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


__all__ = ["Checkpoint", "file_digest", "latest", "newest_whole", "publish", "read",
           "sweep_temporary", "write"]
