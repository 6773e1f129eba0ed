"""Metric sinks on a real run (graphs/grpo_rule.py on a random model, the CLI in its own
process): TensorBoard event files read back by tensorboard's own EventAccumulator, a wandb
offline run whose history is read back from its .wandb file with wandb's own protobuf records,
and the Prometheus endpoint answering real HTTP GETs while the run is live. A sink whose extra
is absent is skipped here; CI installs both (.ci/run)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import test_samples_log

from pivotflow.config import resolve
from pivotflow.errors import ConfigError
from pivotflow.metrics import read_metrics
from pivotflow.run import run
from pivotflow.sinks import SINKS

FAST = ["live=false", "graph.groups_per_step=2", "graph.group_size=2"]
STEPS = 4
pytestmark = pytest.mark.timeout(240)
rule_graph = test_samples_log.rule_graph  # the fixture: graphs/grpo_rule.py, a random model
INSTALLED = [n for n, (module, _) in SINKS.items() if importlib.util.find_spec(module)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def live_run(rule_graph: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[Path, list[str], list[tuple[int, str]]]:
    """(run folder, sinks chosen, GET answers seen while it ran) of one CLI run with every
    installed sink and the metrics endpoint; wandb offline: no credentials in its environment."""
    root = tmp_path_factory.mktemp("sinks")
    out, port = root / "run", free_port()
    sets = [*FAST, f"metrics_port={port}"] + ([f"sinks={','.join(INSTALLED)}"] if INSTALLED
                                              else [])
    env = {k: v for k, v in os.environ.items()
           if k not in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL")}
    env.update(NETRC=str(root / "no-netrc"), WANDB_CONFIG_DIR=str(root / "wandb-config"),
               WANDB_CACHE_DIR=str(root / "wandb-cache"))
    log = open(root / "stderr.log", "wb")  # noqa: SIM115 - the child's
    proc = subprocess.Popen(
        [sys.executable, "-m", "pivotflow.cli", "run", str(rule_graph), "--out", str(out),
         "--steps", str(STEPS), *[a for s in sets for a in ("--set", s)]],
        stdout=subprocess.DEVNULL, stderr=log, env=env)
    log.close()
    answers: list[tuple[int, str]] = []
    try:
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            try:  # until the run has a step in it, then one more look
                answers.append(get(f"http://127.0.0.1:{port}/metrics"))
                if "pivotflow_last_step" in answers[-1][1]:
                    answers.append(get(f"http://127.0.0.1:{port}/nothing-here"))
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.05)  # not listening yet, or just closed
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (root / "stderr.log").read_text()[-3000:]
    return out, INSTALLED, answers


def test_the_endpoint_answers_a_get_during_the_run(live_run: tuple[Path, list[str], list]
                                                   ) -> None:
    out, _, answers = live_run
    assert answers, "the endpoint never answered while the run was live"
    status, body = answers[-2]
    assert status == 200
    for line in ('pivotflow_pool_workers{pool="rollout"} 1.0',
                 'pivotflow_pool_workers{pool="trainer"} 1.0',
                 'pivotflow_queue_depth{edge="prompts->rollout"}',
                 'pivotflow_queue_arrival_rate{edge="prompts->rollout"}',
                 "pivotflow_shifts_total 0.0", "pivotflow_worker_restarts_total 0.0",
                 "pivotflow_tokens_per_second", "# TYPE pivotflow_samples_trained_total counter",
                 'pivotflow_last_step{key="reward_mean"}'):
        assert line in body, f"{line!r} not in the answer:\n{body}"
    version = float(body.split("\npivotflow_policy_version ")[1].split("\n")[0])
    assert 1 <= version <= STEPS
    # from the workers' heartbeats: at most the pool's one worker computes
    for pool in ("rollout", "trainer"):
        line = f'pivotflow_workers_computing{{pool="{pool}"}} '
        assert float(body.split(line)[1].split("\n")[0]) in (0.0, 1.0), body
    assert answers[-1][0] == 404  # another path
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics_requests"] >= 1 and summary["steps"] == STEPS


def test_tensorboard_event_files_hold_every_step(live_run: tuple[Path, list[str], list]) -> None:
    out, chosen, _ = live_run
    if "tensorboard" not in chosen:
        pytest.skip("tensorboard is not installed (pip install 'pivotflow[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"reward_mean", "pools/rollout", "pools/trainer", "queue_depth/prompts->rollout",
            "shifts", "migrations", "train_loss"} <= tags
    metrics = read_metrics(out / "metrics.jsonl")
    for tag, key in (("reward_mean", "reward_mean"), ("time_s", "time_s"),
                     ("tokens_generated", "tokens_generated")):
        events = acc.Scalars(tag)
        assert [e.step for e in events] == list(range(1, STEPS + 1))
        assert [e.value for e in events] == pytest.approx([float(r[key]) for r in metrics])
    assert [e.value for e in acc.Scalars("pools/rollout")] == [1.0] * STEPS


def wandb_records(path: Path) -> list:
    """The Record protobufs of a .wandb file: a 7-byte header (":W&B", a magic, a version),
    then LevelDB's log format: 32 KiB blocks of chunks (crc32c, length, type: full/first/
    middle/last), the block's tail left as padding when a chunk header does not fit."""
    from wandb.proto.wandb_internal_pb2 import Record

    data, pos, records, parts = path.read_bytes(), 7, [], b""
    assert data[:4] == b":W&B", path
    block = 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full, last
            rec = Record()
            rec.ParseFromString(parts)
            records.append(rec)
            parts = b""
    return records


def test_wandb_writes_an_offline_run_with_the_history(live_run: tuple[Path, list[str], list]
                                                      ) -> None:
    out, chosen, _ = live_run
    if "wandb" not in chosen:
        pytest.skip("wandb is not installed (pip install 'pivotflow[wandb]')")
    runs = sorted((out / "wandb").glob("offline-run-*"))  # offline: no credentials here
    assert len(runs) == 1, sorted((out / "wandb").iterdir())
    files = list(runs[0].glob("run-*.wandb"))
    assert len(files) == 1
    history = {}
    for rec in wandb_records(files[0]):
        if rec.WhichOneof("record_type") == "history":
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                     for i in rec.history.item}
            history[int(items["_step"])] = items
    metrics = read_metrics(out / "metrics.jsonl")
    assert sorted(history) == list(range(1, STEPS + 1))
    for r in metrics:
        h = history[r["step"]]
        assert h["reward_mean"] == pytest.approx(r["reward_mean"])
        assert h["pools/rollout"] == 1.0 and h["shifts"] == float(r["shifts"])
        assert h["queue_depth/prompts->rollout"] == float(r["queue_depth"]["prompts->rollout"])


def test_bad_sinks_and_ports_are_one_line_errors_before_anything_is_written(
        rule_graph: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"unknown sink 'tb'; valid: tensorboard, wandb"):
        resolve({"sinks": "tb"}, {})
    with pytest.raises(ConfigError, match=r"'wandb' is given twice"):
        resolve({"sinks": "wandb,wandb"}, {})
    with pytest.raises(ConfigError, match=r"metrics_port=70000: a TCP port is 1-65535"):
        resolve({"metrics_port": 70000}, {})
    for module, extra in SINKS.values():  # an extra that is not installed: its import blocked
        monkeypatch.setitem(sys.modules, module, None)
        with pytest.raises(ConfigError) as err:
            resolve({"sinks": extra}, {})
        assert str(err.value) == (f"--set sinks={extra}: {module} is not installed "
                                  f"(pip install 'pivotflow[{extra}]')")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"^--set metrics_port={port}: cannot listen on "
                                              rf"127\.0\.0\.1:{port}: Address already in use$"):
            run(rule_graph, sets=[*FAST, f"metrics_port={port}"], out=tmp_path / "run",
                steps=1, console=False)
    assert not (tmp_path / "run").exists()


def test_importing_the_sinks_loads_no_extra_and_no_torch() -> None:
    code = ("import sys, pivotflow.sinks, pivotflow.sinks.samples, pivotflow.sinks.prometheus; "
            "print(sorted(m for m in ('torch', 'tensorboard', 'wandb') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_a_resume_draws_each_step_once_in_tensorboard(rule_graph: Path, tmp_path: Path) -> None:
    """The steps after the checkpoint are written again; TensorBoard's reader purges the
    earlier file's events from there on (as metrics.jsonl supersedes those lines)."""
    if "tensorboard" not in INSTALLED:
        pytest.skip("tensorboard is not installed (pip install 'pivotflow[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    sets = [*FAST, "sinks=tensorboard", "checkpoint_every=1"]
    run(rule_graph, sets=sets, out=out, steps=3, console=False)
    first = read_metrics(out / "metrics.jsonl")
    (out / "checkpoints" / "LATEST").write_text("step-000002")
    shutil.rmtree(out / "checkpoints" / "step-000003")
    run(rule_graph, out=out, resume=str(out), steps=4, console=False)
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 2
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("time_s")
    assert [e.step for e in events] == [1, 2, 3, 4]
    metrics = read_metrics(out / "metrics.jsonl")
    assert [e.value for e in events] == pytest.approx([r["time_s"] for r in metrics])
    assert events[2].value != pytest.approx(first[2]["time_s"])  # step 3 is the resumed one's
