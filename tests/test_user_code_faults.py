"""A stage function that fails, on a real run (worker processes, the shared-memory store):
raising on its Nth call, returning the string "1.0", returning NaN, hanging. Each is a one-line
error naming the stage, the graph file's line and the sample; its traceback is in the run's
log; summary.json says why; no /dev/shm store is left. ``on_error="skip"`` drops the group."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pivotflow.errors import StageError
from pivotflow.params.shm_store import default_root
from pivotflow.run import run

FAST = ["live=false", "graph.groups_per_step=2", "graph.group_size=4"]

GRAPH = '''
import time
from pivotflow.graph import Graph
from pivotflow.rl.group_fns import grpo_advantage

DEFAULTS = {{"group_size": 4, "groups_per_step": 2, "lr": 1e-5, "max_tokens": 4,
            "temperature": 1.0, "rollout_workers": 1, "digits": 2}}
CALLS = [0]


def reward(answer: str, completion: str, **_: object) -> object:
    CALLS[0] += 1
{body}


def build(config: dict) -> Graph:
    g = Graph("user_code_faults")
    g.model("policy", source={policy!r})
    g.pool("rollout", workers=1)
    g.pool("trainer", workers=1)
    prompts = g.source("prompts", task="arithmetic", digits=2, group_size=config["group_size"],
                       groups_per_step=config["groups_per_step"])
    rollout = g.generate("rollout", model="policy", pool="rollout", max_tokens=4)
    scored = g.map("reward", reward, writes=["reward"]{options})  # MAP LINE
    advantage = g.group("advantage", grpo_advantage, writes=["advantage"])
    train = g.train("train", model="policy", pool="trainer", lr=config["lr"])
    g.chain(prompts, rollout, scored, advantage, train)
    return g
'''


def graph_file(tmp_path: Path, policy: Path, body: str, options: str = "") -> tuple[Path, str]:
    """The graph file, and the ``file:line`` of its reward stage."""
    text = GRAPH.format(body=body, policy=str(policy), options=options)
    path = tmp_path / "faulty.py"
    path.write_text(text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "# MAP LINE" in t)
    return path, f"{path}:{line}"


def stores_left(out: Path, pid: int) -> list[Path]:
    """Shared-memory stores of this run still there (run.py names them NAME-PID)."""
    return list(default_root("x").parent.glob(f"pivotflow-{out.name}-{pid}*"))


def assert_failed_cleanly(out: Path, message: str, where: str, why: str, pid: int) -> None:
    assert "\n" not in message  # one line
    assert f"map 'reward' at {where} on sample " in message and why in message, message
    summary = json.loads((out / "summary.json").read_text())
    assert summary["error"].startswith("StageError: ") and why in summary["error"]
    log = (out / "logs" / "controller.log").read_text()
    assert "Traceback" in log and where in log
    assert not stores_left(out, pid)


@pytest.mark.parametrize(("body", "why", "in_user_code"), [
    ("    if CALLS[0] == 5:\n        raise ValueError('no reward for call 5')\n    return 1.0",
     "function raised ValueError: no reward for call 5", True),
    ("    return '1.0'", "returned reward='1.0' of type str, expected a number", False),
    ("    return float('nan')", "returned a non-finite reward=nan", False),
], ids=["raises-on-5th-call", "returns-str", "returns-nan"])
def test_a_failing_reward_stops_the_run_naming_stage_line_and_sample(
        tmp_path: Path, random_models: dict[str, Path], body: str, why: str,
        in_user_code: bool) -> None:
    path, where = graph_file(tmp_path, random_models["policy"], body)
    out = tmp_path / "out"
    with pytest.raises(StageError) as info:
        run(path, sets=FAST, out=out, steps=3, console=False)
    assert_failed_cleanly(out, str(info.value), where, why, os.getpid())
    if in_user_code:  # the user's own frame is in the logged traceback
        log = (out / "logs" / "controller.log").read_text()
        assert f'File "{path}"' in log and "in reward" in log


def test_a_hanging_reward_is_an_error_after_its_deadline(
        tmp_path: Path, random_models: dict[str, Path]) -> None:
    """On the CLI: the hung call's thread cannot be killed, yet the process stops and exits
    (the thread is a daemon) well before the sleep would end."""
    path, where = graph_file(tmp_path, random_models["policy"],
                             "    time.sleep(600)\n    return 1.0", ", deadline_s=1.5")
    out = tmp_path / "out"
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pivotflow.cli", "run", str(path), "--out", str(out),
         "--steps", "3", *[a for s in FAST for a in ("--set", s)]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.monotonic() - t0 < 200
    assert proc.returncode == 2, err[-2000:]
    [line] = [t for t in err.splitlines() if t.startswith("error:")]
    assert_failed_cleanly(out, line, where, "function ran longer than its deadline_s=1.5",
                          proc.pid)


def test_on_error_skip_drops_the_group_and_accounts_for_it(
        tmp_path: Path, random_models: dict[str, Path]) -> None:
    path, where = graph_file(
        tmp_path, random_models["policy"],
        "    if CALLS[0] in (5, 6):\n        raise ValueError('flaky')\n    return 1.0",
        ", on_error='skip'")
    out = tmp_path / "out"
    result = run(path, sets=FAST, out=out, steps=3, console=False)
    s = result.summary
    assert s["steps"] == 3 and s["error"] is None
    # calls 5 and 6 may be samples of one group or of two
    assert 1 <= s["groups_skipped"] <= 2
    led = s["ledger"]
    assert led["lost"] == 0 and led["duplicates"] == 0 and led["groups_trained"] == 6
    assert (led["prompts_in"] == led["groups_trained"] + s["groups_skipped"]
            + s["groups_filtered"] + s["groups_in_flight_at_end"])
    log = (out / "logs" / "controller.log").read_text()
    assert "skipped a group (on_error=skip)" in log and where in log and "Traceback" in log
    assert not stores_left(out, os.getpid())
    # the skipped groups survive a resume: the whole run's summary still counts them (the
    # snapshot once left groups_skipped out, and the books then did not balance)
    skipped = s["groups_skipped"]
    s = run(path, out=out, steps=4, console=False, resume=str(out)).summary
    assert s["steps"] == 4 and s["error"] is None and s["groups_skipped"] >= skipped
    led = s["ledger"]
    assert led["lost"] == 0 and led["duplicates"] == 0 and led["groups_trained"] == 8
    assert (led["prompts_in"] == led["groups_trained"] + s["groups_skipped"]
            + s["groups_filtered"] + s["groups_in_flight_at_end"])


def test_bad_fault_options_name_the_graph_line(tmp_path: Path,
                                               random_models: dict[str, Path]) -> None:
    from pivotflow.errors import GraphError

    for options, why in ((", on_error='retry'", "on_error must be one of ['stop', 'skip']"),
                         (", deadline_s=0", "deadline_s must be a number of seconds > 0")):
        path, where = graph_file(tmp_path, random_models["policy"], "    return 1.0", options)
        with pytest.raises(GraphError, match=re.escape(f"map 'reward' at {where}: {why}")):
            run(path, sets=FAST, out=tmp_path / "never", steps=1, console=False)
        assert not (tmp_path / "never").exists()
