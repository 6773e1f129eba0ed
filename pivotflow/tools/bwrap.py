"""The operating system's wall around a tool worker: a bubblewrap (``bwrap``) command line.

The worker process sees a root of its own: read-only binds of the system (``/usr`` and its
``/bin``, ``/lib`` links), of the Python installation, of the pivotflow package and of the
folders the tools are imported from; a private ``/tmp`` (tmpfs, size-capped) as the only
writable place; a ``/proc`` of its own pid namespace (no other process, so no controller's
``environ``); a minimal read-only ``/dev``. Everything else (``/etc/shadow``, ``/root``, the home
folders, the run folder) is simply not there. It has no network (its own empty network
namespace), no System V IPC, a new session, and it dies with its parent: killing ``bwrap``
tears the whole pid namespace down, ``setsid`` survivors included.

The uid is 65534 ("nobody") for real: as root, bwrap keeps only CAP_SETUID/CAP_SETGID for the
sandbox's first instructions, which drop to 65534 before any tool code is imported (see
``sandbox.drop_privileges``); mapping a user namespace's 65534 onto root instead would leave
the process the owner of every root-owned file it could see. Not root: bwrap's user
namespace maps 65534 onto the caller's own uid.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pivotflow

NOBODY = 65534
_PKG_DIR = str(Path(pivotflow.__file__).resolve().parent)
# files the dynamic loader and time functions read; nothing secret
_ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_SYSTEM_LINKS = ("/bin", "/lib", "/lib64", "/lib32", "/libx32", "/sbin")


def executable() -> str | None:
    """The path of ``bwrap``, or None if it is not installed."""
    return shutil.which("bwrap")


def _covered(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def tool_folders(refs: Iterable[str]) -> list[str]:
    """Folders the worker must see to import the tools at ``refs`` ("module:attr"): a
    package's own folder, a plain module's folder (it may import its neighbours)."""
    out: list[str] = []
    for ref in refs:
        top = ref.partition(":")[0].split(".")[0]
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue  # the worker's import reports it, naming the module
        if spec is None:
            continue
        if spec.submodule_search_locations:
            out += [str(Path(p).resolve()) for p in spec.submodule_search_locations]
        elif spec.origin and os.path.isfile(spec.origin):
            out.append(str(Path(spec.origin).resolve().parent))
    return out


def read_only_roots(refs: Iterable[str], extra: Iterable[str] = ()) -> list[str]:
    """Every folder bound read-only: system, Python, pivotflow, tool folders, ``extra``
    (deduplicated, each one not already inside another)."""
    python = {sys.prefix, sys.base_prefix, sys.exec_prefix,
              str(Path(sys.executable).resolve().parents[1])}
    site = [p for p in sys.path if p and os.path.isdir(p) and "-packages" in p]
    wanted = ["/usr", *python, *site, _PKG_DIR, *tool_folders(refs), *extra]
    roots: list[str] = []
    for p in sorted({str(Path(w).resolve()) for w in wanted if os.path.isdir(w)}, key=len):
        if p != "/" and not _covered(p, roots):
            roots.append(p)
    return roots


def command(roots: list[str], hidden: Iterable[str] = (), tmp_mb: int = 64) -> list[str]:
    """The bwrap arguments (up to and including ``--``) for a worker that sees only
    ``roots`` (read-only) and a private ``/tmp`` of ``tmp_mb`` MB; ``hidden`` folders inside
    a root (a run folder next to the graph file) are covered by an empty read-only tmpfs."""
    exe = executable()
    if exe is None:
        raise FileNotFoundError("bwrap is not installed")
    args = [exe, "--die-with-parent", "--new-session", "--clearenv", "--hostname", "sandbox"]
    if os.geteuid() == 0:
        # no user namespace: the uid drop inside is then a real one (see the module docstring)
        args += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                 "--unshare-cgroup-try", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-all", "--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY),
                 "--disable-userns"]  # --unshare-all only tries a user namespace
    # the private /tmp first: a tool folder under the host's /tmp is then bound inside it
    args += ["--proc", "/proc", "--dev", "/dev",
             "--size", str(tmp_mb * 2**20), "--perms", "1777", "--tmpfs", "/tmp"]
    made = {"/", "/tmp"}
    for link in _SYSTEM_LINKS:  # usrmerged systems: links into /usr, else binds
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
            made.add(link)
        elif os.path.isdir(link) and not _covered(link, roots):
            roots = [*roots, link]
    for path in [*roots, *(f for f in _ETC_FILES if os.path.isfile(f))]:
        for parent in reversed(Path(path).parents):
            p = str(parent)
            if p not in made and not _covered(p, roots):
                args += ["--perms", "0755", "--dir", p]  # bwrap's default 0700 locks nobody out
                made.add(p)
        args += ["--ro-bind", path, path]
    for h in hidden:
        h = str(Path(h).resolve())
        if _covered(h, roots) and os.path.isdir(h):
            args += ["--perms", "0000", "--tmpfs", h, "--remount-ro", h]
    # the root and /dev are tmpfs the sandbox user would own in a user namespace (unbounded
    # memory to fill): read-only, so the size-capped /tmp is the only writable place
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp",
             "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
             "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--setenv", "PYTHONNOUSERSITE", "1",
             "--setenv", "PYTHONPATH", str(Path(_PKG_DIR).parent), "--"]
    return args


class Unavailable(OSError):
    """bubblewrap cannot sandbox on this host; the message says why, on one line."""


def sandbox_command(refs: Iterable[str] = (), hidden: Iterable[str] = (),
                    tmp_mb: int = 64, extra: Iterable[str] = ()) -> list[str]:
    """``command`` for code that imports from ``refs`` ("module:attr"; none for plain
    programs) and reads the folders ``extra``, once a sandbox has just started here with the
    same roots (``unavailable``); raises Unavailable otherwise: untrusted code must not run
    unconfined because a package is missing. The tool pool's workers and the code reward's
    programs start behind it."""
    roots = tuple(read_only_roots(refs, extra))
    why = unavailable(roots)
    if why is not None:
        raise Unavailable(why)
    return command(list(roots), hidden, tmp_mb)


def unavailable(roots: tuple[str, ...]) -> str | None:
    """Why a bwrap sandbox cannot start here (one line), or None if one just did: runs
    ``python -c pass`` under exactly the wall the workers get (once per bwrap and roots)."""
    exe = executable()
    return "bubblewrap (bwrap) is not installed" if exe is None else _probe(exe, roots)


@functools.lru_cache(maxsize=8)
def _probe(exe: str, roots: tuple[str, ...]) -> str | None:
    try:
        probe = subprocess.run([*command(list(roots)), sys.executable, "-S", "-c", "pass"],
                               capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap did not start: {exc}"
    if probe.returncode != 0:
        lines = probe.stderr.decode(errors="replace").strip().splitlines() or ["(no output)"]
        return f"bwrap failed (exit {probe.returncode}): {lines[-1][:300]}"
    return None
