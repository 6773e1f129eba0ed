"""Stops from outside, on real processes: SIGTERM and Ctrl-C checkpoint, flush and clean up and
say how to resume; a full disk is a one-line error that leaves the records and the last whole
checkpoint intact; a worker whose controller vanished during its handshake exits by itself."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pivotflow import checkpoints
from pivotflow.metrics import read_metrics
from pivotflow.params.shm_store import default_root

FAST = ["live=false", "graph.groups_per_step=2", "graph.group_size=2"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def rule_graph(tmp_path: Path, random_models: dict[str, Path]) -> Path:
    """graphs/grpo_rule.py (one rollout and one trainer worker, no judge) on a random model."""
    text = (ROOT / "graphs" / "grpo_rule.py").read_text()
    path = tmp_path / "grpo_rule_random.py"
    path.write_text(text.replace("builtin:policy", str(random_models["policy"])))
    return path


def cli(graph: Path, out: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    """The CLI in its own process; its stderr (a line per step) goes to ``log`` (a pipe
    nobody reads fills up and stalls the run)."""
    err = open(log, "wb")  # noqa: SIM115 - the child's
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "pivotflow.cli", "run", str(graph), "--out", str(out),
             *[a for s in FAST for a in ("--set", s)], *args],
            stdout=subprocess.DEVNULL, stderr=err)
    finally:
        err.close()


def finish(proc: subprocess.Popen[bytes], log: Path) -> str:
    try:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return log.read_text(errors="replace")


def wait_for(cond: object, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie waiting for a reaper."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def has_a_step(out: Path) -> bool:
    path = out / "metrics.jsonl"
    return path.exists() and path.read_text().endswith("\n")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_run_with_a_checkpoint_and_says_how_to_resume(
        tmp_path: Path, rule_graph: Path, sig: signal.Signals) -> None:
    out = tmp_path / "out"
    log = tmp_path / "stderr.txt"
    proc = cli(rule_graph, out, log, "--steps", "100000")
    try:
        wait_for(lambda: has_a_step(out), "the run's first step")
        proc.send_signal(sig)
    finally:
        err = finish(proc, log)
    text = " ".join(err.split())  # rich wraps long lines
    assert proc.returncode == (143 if sig == signal.SIGTERM else 130), text[-2000:]
    assert ("stopped (SIGTERM)" if sig == signal.SIGTERM else "interrupted (Ctrl-C)") in text
    assert "Traceback" not in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] >= 1 and ("SIGTERM" if sig == signal.SIGTERM else "Ctrl-C") in (
        summary["error"])
    ckpt, _ = checkpoints.newest_whole(out)
    assert ckpt is not None and 1 <= ckpt.step <= summary["steps"]
    assert f"checkpoint step {ckpt.step} in {out / 'checkpoints'}" in text
    assert f"resume with: pivotflow run {rule_graph} --resume {out}" in text
    assert not [pid for pid in summary["worker_pids"] if alive(pid)]  # reaped
    assert not list(default_root("x").parent.glob(f"pivotflow-*-{proc.pid}"))  # store gone


@pytest.mark.timeout(120)
def test_a_full_disk_is_one_line_and_keeps_the_records_and_the_last_checkpoint(
        tmp_path: Path, rule_graph: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
                           capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mount.stderr.strip()}")
    try:
        out = disk / "out"
        (tmp_path / "logs").mkdir()
        out.mkdir()
        (out / "logs").symlink_to(tmp_path / "logs")  # worker logs elsewhere: only the records
        log = tmp_path / "stderr.txt"
        proc = cli(rule_graph, out, log, "--steps", "100000", "--set", "checkpoint_every=1")
        try:
            wait_for(lambda: (out / "checkpoints" / "LATEST").exists(), "a first checkpoint")
            try:  # the disk fills up under the run
                with open(disk / "filler", "wb", buffering=0) as f:
                    while True:
                        f.write(b"\0" * 4096)
            except OSError:
                pass
        finally:
            text = finish(proc, log)
        assert proc.returncode == 2, text[-2000:]
        [line] = [x for x in text.splitlines() if x.startswith("error:")]
        joined = " ".join(text[text.index("error:"):].split())  # rich wraps the one line
        assert "No space left on device" in joined and str(out) in joined, joined
        assert "Traceback" not in text
        records = read_metrics(out / "metrics.jsonl")  # whole lines only
        assert [r["step"] for r in records] == list(range(1, len(records) + 1))
        ckpt, passed_over = checkpoints.newest_whole(out)  # checksums verified
        assert ckpt is not None and passed_over == [] and ckpt.step <= len(records)
        assert not list((out / "checkpoints").glob(".tmp-*"))  # nothing half-written left
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


PARENT = textwrap.dedent("""
    import os, subprocess, sys, zmq
    endpoint = sys.argv[1]
    router = zmq.Context().socket(zmq.ROUTER)
    router.bind(endpoint)
    log = open(sys.argv[2], "wb")  # not our pipes: the test reads them to their end
    worker = subprocess.Popen([sys.executable, "-m", "pivotflow.worker", "--endpoint",
                               endpoint, "--id", "w0"], start_new_session=True,
                              stdout=log, stderr=log)
    if router.poll(120_000):
        router.recv_multipart()  # its Hello: it waits for a Welcome that never comes
        print(worker.pid, flush=True)
    os._exit(0)  # the controller vanishes mid-handshake, without a goodbye
""")


@pytest.mark.timeout(120)
def test_a_worker_whose_controller_vanished_during_its_handshake_exits(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/ctl.sock"
    log = tmp_path / "w0.log"
    parent = subprocess.run([sys.executable, "-c", PARENT, endpoint, str(log)],
                            capture_output=True, text=True, timeout=150)
    gone_at = time.monotonic()
    assert parent.stdout.strip(), parent.stderr[-2000:]
    pid = int(parent.stdout)
    # it checks every second; the rest is its exit (torch loaded), slow on a loaded machine,
    # but before the 60 s handshake timeout it once waited out, and it says why
    while alive(pid) and time.monotonic() - gone_at < 45:
        time.sleep(0.05)
    assert not alive(pid), log.read_text()[-2000:]
    assert "the controller exited during the handshake" in log.read_text()
