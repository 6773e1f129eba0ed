"""A real run (graphs/grpo_rule.py on a random model, CLI process, real workers, loopback TCP)
with a stranger on its socket the whole time: Hellos claiming the live worker ids, with and
without a nonce, without the run's token, and results from nobody. The run's numbers are the
same step for step as a run without the stranger, and every refusal is in its summary."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from pivotflow.metrics import read_metrics
from pivotflow.protocol import PROTOCOL_VERSION, Hello, JobDone, JobsDone
from pivotflow.transport.admission import TOKEN_ENV
from pivotflow.transport.codec import encode

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
SETS = ["live=false", "graph.groups_per_step=2", "graph.group_size=4", "seed=5"]
# per step: what must not move when a stranger pokes the socket
SAME = ("reward_mean", "response_len_mean", "tokens_generated", "group_ids", "policy_version",
        "train_loss", "train_grad_norm", "train_tokens")


@pytest.fixture
def rule_graph(tmp_path: Path, random_models: dict[str, Path]) -> Path:
    """grpo_rule on a random model, rewarded by the completion's length (a random model never
    gets the sum right): rewards vary, so the policy trains and later steps depend on it."""
    text = (ROOT / "graphs" / "grpo_rule.py").read_text()
    rule = "return 1.0 if check_answer(answer, completion) else 0.0"
    assert rule in text
    text = text.replace(rule, "return float(len(completion) % 3) / 2")
    path = tmp_path / "grpo_rule_random.py"
    path.write_text(text.replace("builtin:policy", str(random_models["policy"])))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(graph: Path, out: Path, port: int, start: str) -> subprocess.Popen[bytes]:
    sets = [*SETS, f"endpoint=tcp://127.0.0.1:{port}", f"worker_start={start}"]
    return subprocess.Popen(
        [sys.executable, "-m", "pivotflow.cli", "run", str(graph), "--out", str(out),
         "--steps", "3", *[a for s in sets for a in ("--set", s)]],
        stdout=subprocess.DEVNULL, stderr=open(out.with_suffix(".log"), "wb"))  # noqa: SIM115


def _worker_ids(out: Path) -> list[str]:
    try:
        return list(json.loads((out / "config.json").read_text())["workers"])
    except (OSError, ValueError, KeyError):
        return []


class Stranger(threading.Thread):
    """Pokes the run's socket every 50 ms until told to stop; notes what came back."""

    def __init__(self, port: int, out: Path) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.out = f"tcp://127.0.0.1:{port}", out
        self.stop = threading.Event()
        self.sent = 0
        self.answers: list[bytes] = []
        self.tokens_in_argv: list[str] = []

    def run(self) -> None:
        ctx = zmq.Context()
        socks: list[zmq.Socket[bytes]] = []
        try:
            while not self.stop.is_set():
                for wid in _worker_ids(self.out):
                    for ident in (f"{wid}#evil{self.sent}".encode(), wid.encode()):
                        s = ctx.socket(zmq.DEALER)
                        s.setsockopt(zmq.LINGER, 0)
                        s.setsockopt(zmq.IDENTITY, ident)
                        s.connect(self.endpoint)
                        s.send(encode(Hello(protocol_version=PROTOCOL_VERSION, worker_id=wid,
                                            pid=1)))
                        s.send(encode(JobsDone(results=[JobDone(
                            job_id=0, token_ids=[1], logprobs=[0.0], versions=[0],
                            finish_reason="stop")])))
                        socks.append(s)
                        self.sent += 2
                for s in socks:
                    while s.poll(0):
                        self.answers.append(s.recv())
                if len(socks) > 200:
                    for s in socks[:100]:
                        s.close(linger=0)
                    del socks[:100]
                self.stop.wait(0.05)
        finally:
            for s in socks:
                s.close(linger=0)
            ctx.term()


def _tokens_on_command_lines() -> tuple[list[str], list[str]]:
    """The run tokens in workers' environments, and any /proc/*/cmdline that holds one."""
    tokens, argvs = [], []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            env = Path(f"/proc/{p}/environ").read_bytes().split(b"\0")
            argvs.append(Path(f"/proc/{p}/cmdline").read_text(errors="replace"))
        except OSError:
            continue
        tokens += [e.split(b"=", 1)[1].decode() for e in env
                   if e.startswith(TOKEN_ENV.encode() + b"=")]
    return tokens, [a for a in argvs if any(t in a for t in tokens)]


def _run(graph: Path, out: Path, stranger: bool) -> tuple[list[dict], dict, Stranger | None]:
    """With the stranger, the workers are exec'd, so /proc shows each one's environment as
    it was given (a forked worker's /proc/PID/environ is its zygote's, which holds no token:
    tests/test_worker_zygote.py); without, forked: the two runs' numbers match either way."""
    port = _free_port()
    proc = _cli(graph, out, port, "exec" if stranger else "fork")
    poke = Stranger(port, out) if stranger else None
    leaked: list[str] = []
    seen_tokens: list[str] = []
    try:
        if poke is not None:
            poke.start()
            deadline = time.monotonic() + 300
            while proc.poll() is None and time.monotonic() < deadline and not seen_tokens:
                seen_tokens, leaked = _tokens_on_command_lines()
                time.sleep(0.2)
        proc.wait(timeout=500)
    finally:
        if proc.poll() is None:
            proc.kill()
        if poke is not None:
            poke.stop.set()
            poke.join(10)
    log = out.with_suffix(".log").read_text(errors="replace")
    assert proc.returncode == 0, log[-3000:]
    if poke is not None:
        assert seen_tokens, "no worker had its token in its environment"
        assert not leaked, f"a run token is on a command line: {leaked}"
    return read_metrics(out / "metrics.jsonl"), json.loads((out / "summary.json").read_text()), poke


def test_a_stranger_on_the_socket_changes_nothing(rule_graph: Path, tmp_path: Path) -> None:
    clean, clean_summary, _ = _run(rule_graph, tmp_path / "clean", stranger=False)
    attacked, summary, poke = _run(rule_graph, tmp_path / "attacked", stranger=True)
    assert poke is not None and poke.sent > 0
    assert [r["step"] for r in attacked] == [1, 2, 3]
    for a, b in zip(clean, attacked, strict=True):
        assert all(a.get(k) is not None for k in SAME), a
        assert {k: a[k] for k in SAME} == {k: b[k] for k in SAME}, (a, b)
    assert any(r["train_grad_norm"] > 0 for r in clean), "the policy never moved"
    adm = summary["admission"]
    assert adm["refused_hellos"] + adm["impostor_frames"] > 0, adm
    assert clean_summary["admission"] == {"tokens_required": True, "refused_hellos": 0, "impostor_frames": 0,
                                          "unregistered_frames": 0, "by_sender": {}}
    # a refused stranger heard "refused" and nothing else: no Welcome, no role, no job
    assert poke.answers and set(poke.answers) == {encode_reject()}
    assert summary["ledger"]["lost"] == 0 and summary["worker_restarts"] == 0


def encode_reject() -> bytes:
    from pivotflow.protocol import Reject

    return encode(Reject(reason="refused"))
