"""A held version of a shared-memory parameter set, and the file-lock rules that hold it.

The rule every process follows (readers, publishers, gc — none of them forked from another):

* a reader takes a *shared* ``flock`` on the version's buffer file, then maps it. Python's mmap
  keeps a dup of the descriptor, and a flock belongs to the open file description, so the lock
  lives exactly as long as the mapping; the mapping lives as long as any tensor view of it
  (``torch.frombuffer`` keeps a reference to the mmap object). The version is held while views
  live, and the mapping is never closed by hand: ``mmap.close()`` would unmap under the views.
* gc collects a version only after taking an *exclusive*, non-blocking flock on its buffer: any
  live reader makes that fail. The kernel drops a process's locks when it dies, SIGKILL included,
  so a dead reader never pins a version.
* a reader re-checks, under its lock, that the path it opened still names the same directory and
  file: if gc won the race, the reader sees that and tries again instead of reading freed bytes.
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import secrets
import shutil
import weakref
from pathlib import Path
from types import TracebackType

import torch

from pivotflow.errors import CheckpointError
from pivotflow.params.index import ParamIndex, crc32, decode, dtype_of

BUFFER = "params.bin"
INDEX = "index.msgpack"


def try_lock_exclusive(fd: int) -> bool:
    """Take an exclusive flock on ``fd`` without waiting; False if anyone holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class HeldVersion:
    """``model@version`` mapped and held. ``tensors`` are zero-copy views into the mapping
    (copy-on-write: writing one changes only this process's copy); ``config`` is the model's
    Hugging Face config dict. The version stays held — gc will not collect it — until
    ``release()`` *and* until every view is gone."""

    def __init__(self, index: ParamIndex, path: Path, fd: int, mapping: mmap.mmap) -> None:
        self.model, self.version, self.config = index.model, index.version, index.config
        self.index, self.path = index, path
        self.tensors: dict[str, torch.Tensor] = {}
        where = str(path / INDEX)
        for e in index.entries:
            dtype = dtype_of(e.dtype, where)
            if e.nbytes == 0:
                self.tensors[e.name] = torch.empty(e.shape, dtype=dtype)
                continue
            view = torch.frombuffer(mapping, dtype=dtype, count=math.prod(e.shape), offset=e.offset)
            self.tensors[e.name] = view.view(e.shape)
        self._map: mmap.mmap | None = mapping
        self._fd: int | None = fd  # shares the mapping's lock; kept for pread in load_into
        # Registered last: if a view above failed, the caller still owns (and closes) fd.
        self._close_fd = weakref.finalize(self, os.close, fd)

    def fileno(self) -> int:
        """The buffer file's descriptor (for pread); raises CheckpointError once released."""
        if self._fd is None:
            raise CheckpointError(f"{self.model}@v{self.version} was released")
        return self._fd

    def verify(self) -> None:
        """Recompute the buffer's crc32; raises CheckpointError naming the file when it differs
        from the index, or when the version was published without a checksum."""
        if self._map is None:
            raise CheckpointError(f"{self.model}@v{self.version} was released")
        if self.index.checksum is None:
            raise CheckpointError(f"{self.path / BUFFER} was published without a checksum")
        with memoryview(self._map) as view:
            got = crc32(view[: self.index.nbytes])
        if got != self.index.checksum:
            raise CheckpointError(
                f"{self.path / BUFFER}: crc32 {got:#010x} does not match the "
                f"index's {self.index.checksum:#010x}"
            )

    def release(self) -> None:
        """Drop this handle's hold (idempotent). Views still alive elsewhere keep the mapping,
        and so the version, held until they are garbage."""
        self.tensors = {}
        self._close_fd()
        self._fd = None
        # Never mmap.close(): torch.frombuffer keeps a reference to the mmap, not a buffer
        # export, so close() would succeed and unmap pages under live views. Dropping our
        # reference lets the last view's death unmap it (and close the dup that holds the lock).
        self._map = None

    def __enter__(self) -> HeldVersion:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _same(path: Path, fd: int) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def open_version(vdir: Path, model: str, version: int) -> HeldVersion | None:
    """Hold the version in ``vdir``; None if it is not there (never published, collected, or
    being replaced — the caller retries). Raises CheckpointError naming a corrupt file."""
    try:
        dfd = os.open(vdir, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    try:
        try:
            bfd = os.open(BUFFER, os.O_RDONLY, dir_fd=dfd)
        except FileNotFoundError:
            return None
        keep = False
        try:
            fcntl.flock(bfd, fcntl.LOCK_SH)  # gc holds its exclusive lock only for an unlink
            if not _same(vdir, dfd) or not _same(vdir / BUFFER, bfd):
                return None  # collected or replaced between our open and our lock
            try:
                with os.fdopen(os.open(INDEX, os.O_RDONLY, dir_fd=dfd), "rb") as f:
                    raw = f.read()
            except FileNotFoundError as exc:
                raise CheckpointError(f"parameter index {vdir / INDEX} is missing") from exc
            index = decode(raw, vdir / INDEX)
            if (index.model, index.version) != (model, version):
                raise CheckpointError(
                    f"parameter index {vdir / INDEX} describes "
                    f"{index.model}@v{index.version}, not {model}@v{version}"
                )
            size = os.fstat(bfd).st_size
            if size != index.nbytes:
                raise CheckpointError(
                    f"parameter buffer {vdir / BUFFER} has {size} bytes; its "
                    f"index says {index.nbytes}"
                )
            # Private and writable: a stray in-place op copies one page instead of crashing on a
            # read-only page or corrupting the version for everyone.
            mapping = mmap.mmap(
                bfd, index.nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
            held = HeldVersion(index, vdir, bfd, mapping)
            keep = True
            return held
        finally:
            if not keep:
                os.close(bfd)
    finally:
        os.close(dfd)


def collect(mdir: Path, vdir: Path, *, rename: bool, spare: int) -> bool:
    """Delete the version (or replaced leftover) in ``vdir`` if nobody holds it, keeping its
    buffer in ``mdir/.spare`` while fewer than ``spare`` are there; False if it is held."""
    try:
        fd = os.open(vdir / BUFFER, os.O_RDONLY)
    except FileNotFoundError:
        shutil.rmtree(vdir, ignore_errors=True)
        return True
    try:
        if not try_lock_exclusive(fd):
            return False  # a reader holds it
        trash = mdir / f".trash-{secrets.token_hex(6)}" if rename else vdir
        if rename:
            os.rename(vdir, trash)
        spares = mdir / ".spare"
        spares.mkdir(exist_ok=True)
        if len(os.listdir(spares)) < spare:
            os.rename(trash / BUFFER, spares / secrets.token_hex(6))
        shutil.rmtree(trash, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def dead_publisher(tmp: Path) -> bool:
    """A ``.tmp-v<V>-<pid>-`` folder is stale when nobody locks it and its pid is gone."""
    try:
        pid = int(tmp.name.split("-")[2])
        fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    except (ValueError, IndexError, OSError):
        return False
    try:
        if not try_lock_exclusive(fd):
            return False
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    finally:
        os.close(fd)
    return False
