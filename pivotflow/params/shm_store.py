"""Global Parameter Storage in host shared memory: one flat buffer per version, zero-copy loads.

Layout under ``root`` (a per-run folder under /dev/shm by default; see ``default_root``)::

    <model>/LATEST                  the newest whole version, replaced atomically
    <model>/v0000000007/params.bin  the flat buffer (every tensor, ALIGN-aligned)
    <model>/v0000000007/index.msgpack  name, dtype, shape, offset, nbytes per tensor + config
    <model>/.spare/                 buffers of collected versions, reused by the next publish
    <model>/.tmp-* .trash-*         a publish in progress; a collected version still mapped

A publish writes a whole version in a private ``.tmp-`` folder, renames it visible, then moves
LATEST forward. Readers hold a version with a shared flock that lives as long as their mapping
(held.py says how); gc collects only versions it can lock exclusively. Every process opens the
store by path — no fork, no ``multiprocessing.shared_memory`` and its resource tracker, which
unlinks segments when an unrelated process that merely attached to them exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import torch

from pivotflow.errors import CheckpointError, ConfigError, ModelConfigError
from pivotflow.params.base import HFConfig
from pivotflow.params.held import (
    BUFFER,
    INDEX,
    HeldVersion,
    collect,
    dead_publisher,
    open_version,
)
from pivotflow.params.index import crc32, encode, plan

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")
_VERSION_DIR = re.compile(r"v(\d{10,})")
_RETRIES = 8  # a load races gc or a re-publish only for the span of one rename
_CHUNK = 1 << 30  # bytes per pread/pwrite call; Linux moves at most ~2 GiB per call


def default_root(run: str | None = None) -> Path:
    """A per-run folder under /dev/shm (RAM) when it is there, else under the temp dir."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / f"pivotflow-{run or f'{os.getpid()}-{secrets.token_hex(4)}'}"


class ShmParamStore:
    """Versioned parameter sets in shared memory, opened by path from any process.

    ``checksum=True`` stores crc32 of each buffer in its index (costs one read of the buffer per
    publish) so ``load(..., verify=True)`` can check it. ``spare`` collected buffers per model
    are kept for reuse: writing into pages tmpfs already has is ~2x faster than into new ones.
    """

    def __init__(
        self, root: str | Path | None = None, *, checksum: bool = False, spare: int = 1
    ) -> None:
        if spare < 0:
            raise ConfigError(f"ShmParamStore: spare must be >= 0, got {spare}")
        self._root = Path(root) if root is not None else default_root()
        self._root.mkdir(parents=True, exist_ok=True)
        self.checksum, self.spare = checksum, spare

    @property
    def root(self) -> Path:
        return self._root

    def _model_dir(self, model: str) -> Path:
        if not isinstance(model, str) or not _NAME.fullmatch(model):
            raise ConfigError(
                f"parameter store {self._root}: bad model name {model!r} (letters, "
                "digits, _ . + -, not starting with '.')"
            )
        return self._root / model

    @contextlib.contextmanager
    def _model_lock(self, mdir: Path) -> Iterator[None]:
        fd = os.open(mdir / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # ---- writing -----------------------------------------------------------------------------

    def publish(
        self, model: str, version: int, tensors: dict[str, torch.Tensor], config: HFConfig
    ) -> None:
        """Write ``model@version`` whole, then make it visible and move LATEST forward to it (a
        lower version than LATEST is stored but LATEST stays). Re-publishing a version replaces
        it; readers holding the old one keep it. ``config`` is the model's Hugging Face config
        as a dict (stored as data; an optimizer-state set, "policy.optim", is published with
        its model's). Raises ConfigError for a bad name or version and CheckpointError for an
        entry that is not a dense tensor or a config that is not a dict of JSON data."""
        mdir = self._model_dir(model)
        if not isinstance(version, int) or version < 0:
            raise ConfigError(f"publish {model}: version must be an int >= 0, got {version!r}")
        index = plan(model, version, tensors, config)
        mdir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-v{version}-{os.getpid()}-", dir=mdir))
        tfd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(tfd, fcntl.LOCK_EX)  # tells gc this publish is alive
            fd = self._claim_spare(mdir, tmp / BUFFER)
            try:
                os.ftruncate(fd, index.nbytes)
                for entry, t in zip(index.entries, tensors.values(), strict=True):
                    _write(
                        fd,
                        _host_bytes(t, f"publish {model}@v{version}: {entry.name!r}"),
                        entry.offset,
                    )
                if self.checksum:
                    index = msgspec.structs.replace(index, checksum=_file_crc(fd, index.nbytes))
            finally:
                os.close(fd)
            (tmp / INDEX).write_bytes(encode(index))
            with self._model_lock(mdir):
                final = mdir / f"v{version:010d}"
                if final.exists():  # holders keep the old one; gc sweeps it when they let go
                    os.rename(final, mdir / f".trash-v{version}-{secrets.token_hex(4)}")
                os.rename(tmp, final)
                current = self._read_latest(mdir)
                if current is None or version >= current:
                    pointer = mdir / f".LATEST.{os.getpid()}"
                    pointer.write_text(str(version))
                    os.replace(pointer, mdir / "LATEST")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            os.close(tfd)

    def _claim_spare(self, mdir: Path, dest: Path) -> int:
        """An open, exclusively locked buffer file at ``dest``: a spare one if any is left."""
        spares = mdir / ".spare"
        for name in sorted(os.listdir(spares)) if spares.is_dir() else []:
            try:
                os.rename(spares / name, dest)  # atomic: one publisher wins each spare
            except FileNotFoundError:
                continue
            fd = os.open(dest, os.O_RDWR)
            fcntl.flock(fd, fcntl.LOCK_EX)  # a reader that lost its race to gc lets go at once
            return fd
        fd = os.open(dest, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    # ---- reading -----------------------------------------------------------------------------

    def _read_latest(self, mdir: Path) -> int | None:
        try:
            return int((mdir / "LATEST").read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise CheckpointError(
                f"parameter store pointer {mdir / 'LATEST'} is unreadable: {exc}"
            ) from exc

    def latest(self, model: str) -> int:
        """The newest published version of ``model``; raises CheckpointError if none."""
        mdir = self._model_dir(model)
        version = self._read_latest(mdir)
        if version is None:
            raise CheckpointError(
                f"parameter store {self._root}: no version of {model!r} "
                f"({mdir / 'LATEST'} is missing)"
            )
        return version

    def versions(self, model: str) -> list[int]:
        """Every visible version of ``model``, oldest first (empty if none)."""
        mdir = self._model_dir(model)
        names = os.listdir(mdir) if mdir.is_dir() else []
        return sorted(int(m.group(1)) for n in names if (m := _VERSION_DIR.fullmatch(n)))

    def acquire(self, model: str, version: int | None = None) -> HeldVersion:
        """Hold ``model@version`` (the latest when None) until released and its views are gone.
        Raises CheckpointError if it is missing (never published or collected) or corrupt."""
        mdir = self._model_dir(model)
        for attempt in range(_RETRIES):
            want = self.latest(model) if version is None else version
            held = open_version(mdir / f"v{want:010d}", model, want)
            if held is not None:
                return held
            time.sleep(0.001 * attempt)
        raise CheckpointError(
            f"parameter store {self._root}: {model}@v{want} is not there "
            f"(never published, or collected); have {self.versions(model)}"
        )

    def load(
        self, model: str, version: int | None = None, *, copy: bool = False, verify: bool = False
    ) -> tuple[int, HFConfig, dict[str, torch.Tensor]]:
        """(version, config, tensors) of ``model@version`` (latest when None); ``config`` is the
        Hugging Face config dict it was published with (a fresh copy). Without ``copy``
        the tensors are zero-copy views and the version stays held while any of them lives;
        with it they are private copies and nothing stays held. ``verify`` checks the crc32.
        Raises CheckpointError (missing, corrupt, checksum mismatch)."""
        held = self.acquire(model, version)
        try:
            if verify:
                held.verify()
            tensors = held.tensors
            if copy:
                tensors = {k: v.clone() for k, v in tensors.items()}
            return held.version, held.config, tensors
        finally:
            held.release()

    def load_into(
        self,
        model: str,
        dest: dict[str, torch.Tensor],
        version: int | None = None,
        *,
        strict: bool = True,
        cast: bool = False,
    ) -> int:
        """Copy ``model@version`` (latest when None) into the preallocated ``dest`` tensors and
        return the version. A contiguous CPU destination is filled by pread straight from the
        shared pages; any other (GPU, strided, ``cast``) through the mapped view. Raises
        ModelConfigError naming a tensor that is missing, misshaped or of another dtype (unless
        ``cast``), or, with ``strict``, a stored tensor ``dest`` lacks; dest is then untouched."""
        with self.acquire(model, version) as held:
            src = held.tensors
            where = f"load_into {model}@v{held.version}"
            for name, d in dest.items():
                s = src.get(name)
                if s is None:
                    raise ModelConfigError(f"{where}: tensor {name!r} is not in the store")
                if s.shape != d.shape or (s.dtype != d.dtype and not cast):
                    raise ModelConfigError(
                        f"{where}: tensor {name!r} is {s.dtype} "
                        f"{list(s.shape)} in the store, {d.dtype} "
                        f"{list(d.shape)} in the destination"
                    )
            if strict and (extra := sorted(set(src) - set(dest))):
                raise ModelConfigError(f"{where}: the destination lacks {extra[:5]}")
            offsets = {e.name: e.offset for e in held.index.entries}
            with torch.no_grad():
                for name, d in dest.items():
                    s = src[name]
                    if d.device.type == "cpu" and d.is_contiguous() and d.dtype == s.dtype:
                        _read(held.fileno(), d, offsets[name])
                    else:
                        d.copy_(s)
            return held.version

    # ---- collecting --------------------------------------------------------------------------

    def gc(self, model: str, keep: int = 2) -> list[int]:
        """Delete the versions older than the ``keep`` newest (and never LATEST) that nobody
        holds; sweep leftovers of dead publishers and released replaced versions. Returns the
        versions collected. Raises ConfigError if ``keep`` < 1."""
        if keep < 1:
            raise ConfigError(f"gc {model}: keep must be >= 1, got {keep}")
        mdir = self._model_dir(model)
        if not mdir.is_dir():
            return []
        collected = []
        with self._model_lock(mdir):
            have = self.versions(model)
            protected = set(have[-keep:]) | {self._read_latest(mdir)}
            for v in have:
                if v not in protected and collect(
                    mdir, mdir / f"v{v:010d}", rename=True, spare=self.spare
                ):
                    collected.append(v)
            for name in os.listdir(mdir):
                if name.startswith(".trash-"):
                    collect(mdir, mdir / name, rename=False, spare=self.spare)
                elif name.startswith(".tmp-") and dead_publisher(mdir / name):
                    shutil.rmtree(mdir / name, ignore_errors=True)
        return collected

    def cleanup(self) -> None:
        """Remove the whole root. Processes still holding views keep their (unlinked) memory
        until they drop them."""
        shutil.rmtree(self._root, ignore_errors=True)


def _host_bytes(t: torch.Tensor, where: str) -> memoryview:
    if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
        raise CheckpointError(f"{where} is not a dense tensor ({t.layout}, {t.device})")
    flat = t.detach().resolve_conj().resolve_neg().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data if flat.numel() else memoryview(b"")


def _write(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done : done + _CHUNK], offset + done)


def _read(fd: int, dest: torch.Tensor, offset: int) -> None:
    if dest.numel() == 0:
        return
    view = dest.detach().view(-1).view(torch.uint8).numpy().data
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done : done + _CHUNK]], offset + done)
        if n == 0:
            raise CheckpointError(f"parameter buffer ended at byte {offset + done}")
        done += n


def _file_crc(fd: int, nbytes: int) -> int:
    with (
        mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as m,
        memoryview(m) as view,
    ):
        return crc32(view)
