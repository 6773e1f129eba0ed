"""The tool worker process: runs tool calls one at a time under limits. Started by ToolPool.

Wire: JSON lines on private copies of stdin/stdout (fds 0 and 1 themselves point at /dev/null,
so a tool's stray ``print`` cannot corrupt the stream). No pickle. The first line in is the
config, the first line out is ``{"ready": ...}``; then one request line in, one reply line out.

What confines a tool, strongest first (see ToolPool for the parent's part):

* the operating system, when the pool isolates (the default; ``bwrap.py``): this process runs
  in a bubblewrap sandbox (its own mount, pid, network, IPC and UTS namespaces; read-only
  system, Python and tool folders; a private ``/tmp``) and, before it imports any tool, drops
  to uid 65534 with no capabilities and ``no_new_privs`` set (``drop_privileges``). What a
  tool can see or change is then decided by the kernel, not by code it could reach.
* kernel-enforced limits set here before a tool is imported: ``RLIMIT_AS`` (memory, soft =
  hard so a tool cannot raise it), ``RLIMIT_NPROC`` (processes and threads of uid 65534),
  ``RLIMIT_FSIZE`` (a write past it fails with EFBIG), ``RLIMIT_NOFILE``, ``RLIMIT_CORE`` = 0,
  a CPU-time timer (``ITIMER_PROF``, default action kills) per call with ``RLIMIT_CPU`` one
  second later as a backstop. Unisolated (``isolation="none"``) it still takes a network
  namespace of its own where the kernel allows it (``unshare(CLONE_NEWNET)``).
* a Python audit hook (PEP 578) that refuses socket creation and DNS, fork/exec/spawn/subprocess,
  signals to other processes and ``setrlimit``. It is a tripwire, not a wall: native code
  (ctypes) does not pass through it, and Python code in this process can reach its state (the
  ``gc`` trick). Its job is to make ordinary code fail fast with a clear message; a call that
  switched it off is reported as ``forbidden`` and its worker replaced.
* after each call, a worker with any other process left in its sandbox (children, ``setsid``
  survivors: the pid namespace shows them all) or extra threads asks to be replaced; the parent
  kills ``bwrap``, and the kernel ends every process of the namespace with it.
"""

from __future__ import annotations

import io
import json
import math
import os
import resource
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38
NOBODY = 65534

# audit event -> violation kind
_FORBIDDEN = {
    "socket.__new__": "network",
    "socket.getaddrinfo": "network",
    "socket.gethostbyname": "network",
    "socket.gethostbyaddr": "network",
    "socket.getnameinfo": "network",
    "os.fork": "fork",
    "os.forkpty": "fork",
    "os.system": "fork",
    "os.posix_spawn": "fork",
    "os.spawn": "fork",
    "os.exec": "fork",
    "subprocess.Popen": "fork",
    "pty.spawn": "fork",
    "os.kill": "forbidden",
    "os.killpg": "forbidden",
    "signal.pthread_kill": "forbidden",
    "resource.setrlimit": "forbidden",
    "resource.prlimit": "forbidden",
}


class _Guard:
    """The audit hook and what it saw during the current call."""

    def __init__(self) -> None:
        self.violation: tuple[str, str] | None = None  # (kind, what the tool did)
        self.trusted = False  # the worker loop's own setrlimit/kill are allowed

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        kind = _FORBIDDEN.get(event)
        if kind is None or self.trusted:
            return
        if event == "os.kill" and args and args[0] == os.getpid():
            return
        why = " (tools have no network access)" if kind == "network" else ""
        if self.violation is None:
            self.violation = (kind, f"tried {event}, which the tool sandbox forbids{why}")
        raise PermissionError(f"the tool sandbox forbids {event}{why}")


class _CappedText(io.TextIOBase):
    """A stdout stand-in that keeps only the first ``cap`` characters printed."""

    def __init__(self, cap: int) -> None:
        self.cap, self.size = cap, 0
        self.parts: list[str] = []

    def write(self, s: str) -> int:
        if self.size <= self.cap:
            self.parts.append(s[: self.cap + 1 - self.size])
            self.size += len(self.parts[-1])
        return len(s)

    def getvalue(self) -> str:
        return "".join(self.parts)


def _new_net_namespace() -> bool:
    import ctypes  # imported here, before the audit hook, and only for this

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET
        return libc.unshare(flags) == 0
    except (OSError, AttributeError):
        return False


def drop_privileges() -> int:
    """Set ``no_new_privs`` (no setuid binary can give privileges back) and, as root, become
    uid/gid 65534 with no supplementary groups, which also clears every capability (bwrap lent
    CAP_SETUID/CAP_SETGID for this only). Returns the uid now; raises OSError if a step fails."""
    import ctypes  # before the audit hook, and only for this and the net namespace

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
    return os.getuid()


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _others_in_namespace() -> bool:
    """Any process in this pid namespace but its init (bwrap's, pid 1) and this one."""
    me = os.getpid()
    return any(p.isdigit() and int(p) not in (1, me) for p in os.listdir("/proc"))


def _has_children() -> bool:
    try:
        with open(f"/proc/self/task/{os.getpid()}/children") as f:
            return bool(f.read().strip())
    except OSError:
        return False


def _to_text(value: Any, printed: str) -> str:
    if value is None:
        return printed
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def _run(
    fn: Callable[..., Any],
    args: dict[str, Any],
    cpu_s: float,
    cap: int,
    guard: _Guard,
    leftovers: Callable[[], bool],
) -> dict[str, Any]:
    used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    guard.trusted = True
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (math.ceil(used + cpu_s) + 1, hard))
    guard.trusted, guard.violation = False, None
    out = _CappedText(cap)
    kind, error, value = "ok", None, None
    old_stdout, sys.stdout = sys.stdout, out
    signal.setitimer(signal.ITIMER_PROF, cpu_s)
    try:
        value = fn(**args)
    except MemoryError:
        kind, error = "memory", "ran out of memory"
    except BaseException as exc:  # a tool's SystemExit or KeyboardInterrupt is its error too
        kind, error = "error", f"{type(exc).__name__}: {exc}"
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        sys.stdout = old_stdout
    recycle = kind == "memory" or threading.active_count() > 1
    if guard.trusted:  # only a tool sets it during a call: the gc trick
        guard.trusted = False
        guard.violation = guard.violation or (
            "forbidden",
            "switched the sandbox's audit hook off, which the tool sandbox forbids",
        )
    if leftovers():
        guard.violation = guard.violation or (
            "fork",
            "left a child process running, which the tool sandbox forbids",
        )
    if guard.violation is not None:
        (kind, error), recycle = guard.violation, True
    try:
        content = _to_text(value, out.getvalue()) if error is None else ""
    except MemoryError:
        kind, error, content, recycle = (
            "memory",
            "ran out of memory formatting the result",
            "",
            True,
        )
    truncated = len(content) > cap
    return {
        "kind": kind,
        "error": error,
        "content": content[:cap],
        "truncated": truncated,
        "chars": len(content),
        "recycle": recycle,
    }


def main() -> int:
    """Serve tool calls on stdin/stdout until stdin closes."""
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)

    def send(obj: dict[str, Any]) -> None:
        proto_out.write(json.dumps(obj, ensure_ascii=False).encode() + b"\n")
        proto_out.flush()

    cfg = json.loads(proto_in.readline())
    isolated = bool(cfg.get("isolated"))
    try:
        uid = drop_privileges() if isolated else os.getuid()
        if isolated and uid == 0:
            raise OSError("still uid 0 after dropping privileges")
    except OSError as exc:
        send({"ready": False, "error": f"cannot drop privileges: {exc}"})
        return 1
    sys.path[:] = cfg["sys_path"]
    try:
        from pivotflow.tools.registry import callable_from_ref

        fns = {name: callable_from_ref(ref) for name, ref in cfg["tools"].items()}
    except Exception as exc:
        send({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    # a parent that ignores these would pass that on, and the CPU limit would not kill
    for sig in (signal.SIGPROF, signal.SIGXCPU):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE fails, EFBIG
    net = isolated or (_new_net_namespace() if cfg.get("netns", True) else False)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cfg.get("file_size_mb"):
        size = int(cfg["file_size_mb"]) * 2**20
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    if cfg.get("open_files"):
        resource.setrlimit(resource.RLIMIT_NOFILE, (cfg["open_files"], cfg["open_files"]))
    if cfg.get("memory_mb"):
        limit = _vm_bytes() + int(cfg["memory_mb"]) * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    nproc = os.geteuid() != 0 and cfg.get("nproc") is not None
    if nproc:
        resource.setrlimit(resource.RLIMIT_NPROC, (cfg["nproc"], cfg["nproc"]))
    guard = _Guard()
    sys.addaudithook(guard.hook)
    send(
        {
            "ready": True,
            "pid": os.getpid(),
            "isolation": {
                "os": "bwrap" if isolated else "none",
                "uid": uid,
                "pid_namespace": isolated and os.getpid() == 2,
                "net_namespace": net,
                "audit_hook": True,
                "rlimit_nproc": nproc,
            },
        }
    )
    leftovers = _others_in_namespace if isolated else _has_children
    cap = int(cfg["max_output_chars"])
    for line in proto_in:
        req = json.loads(line)
        fn = fns.get(req["name"])
        if fn is None:  # the parent checks names first; this is a second line of defence
            reply = {
                "kind": "unknown_tool",
                "error": f"unknown tool {req['name']!r}",
                "content": "",
                "truncated": False,
                "chars": 0,
                "recycle": False,
            }
        else:
            reply = _run(fn, req["arguments"], float(req["cpu_s"]), cap, guard, leftovers)
        reply["id"] = req["id"]
        send(reply)
    return 0


if __name__ == "__main__":
    sys.exit(main())
