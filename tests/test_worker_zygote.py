"""The local launcher's worker zygote (``launch/zygote.py``): workers forked from one process
that imported torch once, each in its own session with its own log, reaped and reported as
exec'd ones are; a killed zygote takes its workers and the launcher starts another; garbage on
its pipe is a one-line error. Real processes throughout (workers wait for a controller that
never answers, as in tests/test_local_gpus.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pivotflow.errors import ConfigError, ProtocolError
from pivotflow.launch.forked_workers import ForkedWorker
from pivotflow.launch.local import LocalLauncher
from pivotflow.launch.zygote_frames import FrameReader, write_frame
from pivotflow.protocol import FromZygote, WorkerExited, WorkerForked
from pivotflow.run import run
from pivotflow.transport.admission import TOKEN_ENV, worker_token

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parent


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def exited_within(launcher: LocalLauncher, worker_id: str, seconds: float) -> int | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        codes = dict(launcher.exited())
        if worker_id in codes:
            return codes[worker_id]
        time.sleep(0.05)
    return None


def test_forked_workers_are_the_zygotes_children_each_in_its_own_session(tmp_path: Path) -> None:
    nobody = f"ipc://{tmp_path}/nobody-listens"  # the workers wait for a controller
    launcher = LocalLauncher(nobody, tmp_path / "logs", fork=True)
    try:
        for w in ("w0", "w1"):
            launcher.start(w)
        handles = launcher.procs
        assert all(isinstance(h, ForkedWorker) for h in handles.values())
        zygote = launcher._zygote
        assert zygote is not None
        pids = {w: h.pid for w, h in handles.items()}
        assert len(set(pids.values())) == 2
        for pid in pids.values():
            assert parent_of(pid) == zygote.proc.pid
            assert os.getsid(pid) == pid  # Ctrl-C at the terminal is the controller's
        assert os.getsid(zygote.proc.pid) == zygote.proc.pid
        assert launcher.exited() == []
        assert launcher.kill("w1")
        assert exited_within(launcher, "w1", 10.0) == -signal.SIGKILL
        assert not launcher.kill("w1")  # gone already
        assert handles["w1"].wait(0) == -signal.SIGKILL  # as Popen's: a known exit at 0 s
        with pytest.raises(subprocess.TimeoutExpired):
            handles["w0"].wait(0)
        assert handles["w0"].poll() is None
        assert (tmp_path / "logs" / "w0.log").exists() and (tmp_path / "logs" / "zygote.log").exists()
    finally:
        launcher.stop(timeout_s=0.1)
    assert all(h.poll() is not None for h in launcher.procs.values())
    assert zygote.proc.poll() is not None  # reaped
    for pid in pids.values():
        assert not Path(f"/proc/{pid}").exists()


def test_a_killed_zygote_takes_its_workers_and_another_starts(tmp_path: Path) -> None:
    launcher = LocalLauncher(f"ipc://{tmp_path}/nobody", tmp_path / "logs", fork=True)
    try:
        launcher.start("w0")
        first = launcher._zygote
        assert first is not None
        worker_pid = launcher.procs["w0"].pid
        os.kill(first.proc.pid, signal.SIGKILL)
        assert exited_within(launcher, "w0", 10.0) == -signal.SIGKILL
        deadline = time.monotonic() + 10.0  # PR_SET_PDEATHSIG: the worker went with it
        while Path(f"/proc/{worker_pid}").exists() and time.monotonic() < deadline:
            if Path(f"/proc/{worker_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break  # (a zombie until init reaps it)
            time.sleep(0.05)
        assert not Path(f"/proc/{worker_pid}").exists() or \
            Path(f"/proc/{worker_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        note = (tmp_path / "logs" / "w0.log").read_text()
        assert "went with the worker zygote, which exited with code -9" in note
        launcher.start("w0~r1")  # the replacement comes from a new zygote
        assert launcher.zygotes_started == 2 and launcher._zygote is not first
        assert launcher.procs["w0~r1"].pid > 0 and launcher.procs["w0~r1"].poll() is None
    finally:
        launcher.stop(timeout_s=0.1)


def test_frames_round_trip_and_garbage_is_a_one_line_error(tmp_path: Path) -> None:
    r, w = os.pipe()
    try:
        write_frame(w, WorkerForked(worker_id="w0", pid=12))
        write_frame(w, WorkerExited(worker_id="w0", pid=12, code=-9))
        reader: FrameReader[FromZygote] = FrameReader(FromZygote, "the worker zygote")
        data = os.read(r, 1 << 16)
        got = list(reader.feed(data[:5])) + list(reader.feed(data[5:]))  # split anywhere
        assert got == [WorkerForked(worker_id="w0", pid=12),
                       WorkerExited(worker_id="w0", pid=12, code=-9)]
    finally:
        os.close(r)
        os.close(w)
    garbage = FrameReader(FromZygote, "the worker zygote")
    with pytest.raises(ProtocolError, match=r"^the worker zygote: a frame that does not "
                                            r"decode: .*") as err:
        list(garbage.feed(b"\x00\x00\x00\x03abc"))
    assert "\n" not in str(err.value)
    with pytest.raises(ProtocolError, match=r"^the worker zygote: a frame of 4294967295 bytes"):
        list(FrameReader(FromZygote, "the worker zygote").feed(b"\xff\xff\xff\xff"))


def test_a_zygote_sent_garbage_exits_with_one_line_and_its_workers_go(tmp_path: Path) -> None:
    launcher = LocalLauncher(f"ipc://{tmp_path}/nobody", tmp_path / "logs", fork=True)
    try:
        launcher.start("w0")
        zygote = launcher._zygote
        assert zygote is not None and launcher.procs["w0"].pid > 0
        os.write(zygote._to, b"\x00\x00\x00\x04junk")
        assert exited_within(launcher, "w0", 10.0) == -signal.SIGKILL
        assert zygote.proc.wait(10) == 2
        log = (tmp_path / "logs" / "zygote.log").read_text().strip().splitlines()
        assert log[-1].startswith("worker zygote: the launcher: a frame that does not decode")
        # what the controller quotes when it declares the worker dead: the zygote's last words
        note = (tmp_path / "logs" / "w0.log").read_text()
        assert "went with the worker zygote, which exited with code 2" in note
        assert note.rstrip().endswith(log[-1])
    finally:
        launcher.stop(timeout_s=0.1)


def test_a_run_with_exec_workers_and_an_unknown_start_refused(tmp_path: Path,
                                                              random_genrm_graph: Path) -> None:
    fast = ["live=false", "graph.groups_per_step=2", "graph.group_size=4"]
    result = run(random_genrm_graph, sets=[*fast, "worker_start=exec"], out=tmp_path / "out",
                 steps=2, console=False)
    assert result.summary["ledger"]["groups_trained"] == 4
    assert not (result.out / "logs" / "zygote.log").exists()  # none forked
    with pytest.raises(ConfigError, match=r"^--set worker_start=spawn: unknown; valid: auto, "
                                          r"fork, exec$"):
        run(random_genrm_graph, sets=[*fast, "worker_start=spawn"], out=tmp_path / "o2",
            steps=2, console=False)


def test_a_forked_workers_token_is_on_no_command_line_and_in_no_environ(tmp_path: Path) -> None:
    """The token reaches the worker over the zygote's pipe: its /proc environ is the zygote's
    (which never held one) and its command line the zygote's (which names none). That the
    worker gets it is every run's Hello (admission refuses a worker without it)."""
    launcher = LocalLauncher(f"ipc://{tmp_path}/nobody", tmp_path / "logs", fork=True,
                             secret=b"s" * 32)
    try:
        launcher.start("w0")
        pid = launcher.procs["w0"].pid
        token = worker_token(b"s" * 32, "w0")
        for path in (f"/proc/{pid}/environ", f"/proc/{pid}/cmdline"):
            text = Path(path).read_bytes()
            assert token.encode() not in text and TOKEN_ENV.encode() not in text, path
    finally:
        launcher.stop(timeout_s=0.1)
