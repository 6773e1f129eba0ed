"""Each test case of the code reward's runner (``code_runner.py``) as a process forked from a
clean interpreter, not started afresh.

Before the runner reads its job it forks a *case forker* (a zygote: the interpreter as
``python -S -I`` leaves it, with no job, no expected output and never any program code), and
each case is a child of the forker that takes a session of its own, its limits and uid (as
root: its sandbox slot's), closes every descriptor it inherited, and runs the program as
``__main__`` as the interpreter would (``run_as_main``: ``SystemExit``'s status, an uncaught
exception's traceback and status 1, non-daemon threads joined, ``atexit``, status 120 when
stdout cannot be flushed). The forker waits for it, kills its session at its timeout or when it
ends, and tells the runner how it ended; the runner alone reads and judges what it wrote.

Why: a fresh ``python -S -I`` takes 7-8 ms here before the program starts, most of a short
case's cost; a fork takes under 0.5 ms (``bench/code_reward.py``'s ``case_start_ms`` and
``case_fork_ms``; 2.3-3.3x the programs a second). What differs from a fresh interpreter:
the cases of one program share its string hash seed (drawn once per sandbox, not per case), and
the standard library modules the forker holds are imported already.

Standard library only: the runner loads it by its path (it runs with ``-S -I``).
"""

from __future__ import annotations

# (what the interpreter has loaded or builds in: code_runner.py says why)
import _signal
import atexit
import builtins
import io
import marshal
import os
import resource
import select
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

MAX_FD = 1 << 20  # closed up to (the forker holds far fewer): one close_range call on Linux
CANNOT_START = 126  # a case's status when it fails before the program runs
# what of the job a case's process is told (never the program's cases or expected outputs)
CASE_KEYS = ("work", "timeout_s", "memory_mb", "nproc", "uid", "isolated")


class CaseForker:
    """The runner's end of the case forker (the module says why): a request a case, its end as
    the reply (``{"ended": bool, "status": exit code or -signal}``), each a marshalled dict
    (the runner and the forker are one interpreter and trust each other; no case holds the
    pipes)."""

    def __init__(self) -> None:
        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(requests_w)
            os.close(replies_r)
            _forker(requests_r, replies_w)
        os.close(requests_r)
        os.close(replies_w)
        self.requests = os.fdopen(requests_w, "wb")
        self.replies = os.fdopen(replies_r, "rb")

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        marshal.dump(request, self.requests)
        self.requests.flush()
        try:
            reply: dict[str, Any] = marshal.load(self.replies)
        except EOFError:
            raise RuntimeError("the case forker is gone") from None
        return reply

    def preload(self, module: str) -> None:
        """Has the forker import ``module`` (a standard one every case would import), so each
        case has it without the import."""
        self.run({"preload": module})

    def close(self) -> None:
        self.requests.close()  # (its end of file: the forker exits)
        os.waitpid(self.pid, 0)
        self.replies.close()


def _forker(requests: int, replies: int) -> NoReturn:
    """The case forker: forks a case a request, waits for it (or kills it at its timeout) and
    says how it ended, until the requests end."""
    status = 0
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1):  # the runner's job and answer: not the forker's, nor a case's
            os.dup2(null, fd)
        os.close(null)
        with os.fdopen(requests, "rb") as inbox, os.fdopen(replies, "wb") as outbox:
            while True:
                try:
                    request = marshal.load(inbox)
                except EOFError:  # (the runner is done)
                    break
                if "preload" in request:
                    __import__(request["preload"])
                    reply: dict[str, Any] = {}
                else:
                    reply = _fork_case(request)
                marshal.dump(reply, outbox)
                outbox.flush()
    except BaseException as exc:  # (its stderr is the runner's: the sandbox's why)
        print(f"code_runner: the case forker failed: {exc!r}", file=sys.stderr)
        status = 1
    os._exit(status)


def _fork_case(request: dict[str, Any]) -> dict[str, Any]:
    """One case's process, from its fork to its reaping. Its session is killed whole while its
    own process is still unreaped: a reaped pid may be reused, by another process that leads a
    group of its own, and a kill of that group would reach it (unsandboxed, any process of the
    host)."""
    try:
        pid = os.fork()
    except OSError as exc:
        return {"error": f"could not start: {exc}"}
    if pid == 0:
        _case(request)
    pidfd = os.pidfd_open(pid)  # readable once it exits, before anyone reaps it
    try:
        ended = bool(select.select([pidfd], [], [], request["timeout_s"])[0])
        for kill in (os.killpg, os.kill):  # its session: it, and what it left; and it, had
            try:  # noqa: SIM105 (it not reached setsid yet; no contextlib here)
                kill(pid, _signal.SIGKILL)
            except ProcessLookupError:
                pass
    finally:
        os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    return {"ended": ended, "status": os.waitstatus_to_exitcode(status)}


def _case(request: dict[str, Any]) -> NoReturn:
    """A case's process (a child of the forker): its files as 0, 1 and 2 and nothing else
    open, a session of its own, its limits and uid, the environment a fresh ``python -S -I``
    would get from the runner; then the program as ``__main__`` (``script``) or an executable
    in its place (``argv``)."""
    try:
        os.setsid()
        work = request["work"]
        opened = [os.open(f"{work}/in", os.O_RDONLY), os.open(f"{work}/out", os.O_WRONLY),
                  os.open(f"{work}/err", os.O_WRONLY)]
        for target, fd in enumerate(opened):
            os.dup2(fd, target)
        os.closerange(3, MAX_FD)  # (the forker's channel to the runner among them)
        os.chdir(work)
        _limits(request)
        os.environ.clear()
        os.environ["PATH"] = "/usr/bin"
        sys.stdin, sys.stdout, sys.stderr = (
            _stream(fd, like) for fd, like in enumerate((sys.stdin, sys.stdout, sys.stderr)))
        for name in ("stdin", "stdout", "stderr"):  # (the originals, as a program sees them)
            setattr(sys, f"__{name}__", getattr(sys, name))
        atexit._clear()  # (nothing of the forker's runs at the program's exit)
    except BaseException as exc:
        try:
            os.write(2, f"code_runner: the case could not start: {exc!r}\n".encode())
        finally:
            os._exit(CANNOT_START)
    status = 1
    try:  # (never back into the forker's code, whatever the program did)
        if "argv" in request:  # an executable (a compiled program, its compiler): in place
            for number in (_signal.SIGPIPE, _signal.SIGXFSZ):  # (the interpreter ignores
                _signal.signal(number, _signal.SIG_DFL)  # them; an exec'd program must not)
            os.execv(request["argv"][0], request["argv"])
        status = run_as_main(request["script"])
    except OSError as exc:  # (execv's: no such file, not executable)
        os.write(2, f"code_runner: could not run {request['argv'][0]}: {exc}\n".encode())
        status = CANNOT_START
    finally:
        os._exit(status)


def _stream(fd: int, like: Any) -> Any:
    """A standard stream on ``fd`` as the interpreter made ``like`` (encoding, errors, line
    buffering), over the case's own file."""
    raw = open(fd, "rb" if fd == 0 else "wb", closefd=False)  # noqa: SIM115 (returned)
    return io.TextIOWrapper(raw, encoding=like.encoding, errors=like.errors,
                            line_buffering=like.line_buffering)


def run_as_main(path: str) -> int:
    """Runs the file ``path`` in this process as ``python -S -I path`` runs it; its exit
    status: 0, ``SystemExit``'s code (a code that is not a number printed, status 1), 1 with
    the traceback on stderr for an uncaught exception; then, as the interpreter ends,
    non-daemon threads joined, ``atexit`` functions run, and 120 if stdout cannot be
    flushed."""
    main = type(sys)("__main__")
    main.__dict__.update(__file__=path, __builtins__=builtins, __cached__=None)
    sys.modules["__main__"] = main
    sys.argv = [path]
    try:
        with open(path, "rb") as f:
            source = f.read()
        # dont_inherit: this module's own `from __future__` does not reach the program
        exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)
        status = 0
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except BaseException as exc:
        # from the program's frame on, as the interpreter prints it (the hook prints the
        # exception's own traceback, not the one passed beside it: cut it there)
        tb = exc.__traceback__
        exc = exc.with_traceback(tb.tb_next if tb is not None and tb.tb_next else tb)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        status = 1
    return _finalized(status)


def _exit_status(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:  # noqa: SIM105 (no contextlib here)
        print(code, file=sys.stderr)
    except BaseException:  # (a message that cannot be printed: still status 1)
        pass
    return 1


def _finalized(status: int) -> int:
    """What the interpreter does as it ends: non-daemon threads joined, atexit functions run,
    the standard streams flushed (120 if stdout cannot be); a failure in one is passed over,
    as there."""
    threading = sys.modules.get("threading")
    for end in ((threading._shutdown,) if threading is not None else ()) + (
            atexit._run_exitfuncs,):
        try:  # noqa: SIM105 (no contextlib here)
            end()
        except BaseException:  # (the interpreter reports it and goes on)
            pass
    streams = {id(s): s for s in (sys.stdout, sys.__stdout__, sys.stderr, sys.__stderr__)}
    for stream in streams.values():
        try:
            if stream is not None:
                stream.flush()
        except BaseException:
            if stream is sys.stdout or stream is sys.__stdout__:
                status = 120  # (the interpreter's status when stdout cannot be flushed)
    return status


def _limits(job: dict[str, Any]) -> None:
    """In each case's process, before it runs: the limits, then the job's uid where we are
    root."""
    mb = job["memory_mb"]
    cpu = int(job["timeout_s"]) + 1
    for what, value in ((resource.RLIMIT_AS, mb * 2**20), (resource.RLIMIT_CPU, cpu),
                        (resource.RLIMIT_FSIZE, 16 * 2**20), (resource.RLIMIT_NOFILE, 64),
                        (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(what, (value, value))
    if job["isolated"] and os.geteuid() == 0:  # (unsandboxed, it may not reach python)
        resource.setrlimit(resource.RLIMIT_NPROC, (job["nproc"], job["nproc"]))
        os.setgroups([])
        uid = int(job["uid"])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
