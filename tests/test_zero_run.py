"""Sharded optimizer state in a whole run (``zero_stage`` 1, ``worker/sharded_adam.py``): two
trainers of the main job hold half of AdamW's state each, workers SIGKILLed under chaos (a
trainer among them) are replaced and the state is re-cut from the store, every version still
carries one optimizer step, and the checkpoint it writes resumes under the replicated layout
(the stored state is the same either way). The local launcher hands each worker a GPU of its
own and each replacement a dead worker's (``launch/local.py``; the workers run on CPU here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pivotflow import checkpoints
from pivotflow.metrics import read_metrics
from pivotflow.run import run

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
GRPO = ROOT / "graphs" / "grpo_genrm.py"


def optimizer_steps(out: Path) -> set[float]:
    ckpt = checkpoints.read(checkpoints.latest(out) or out)
    assert ckpt.optimizer is not None
    return {float(v) for k, v in ckpt.optimizer.items() if k.endswith(".step")}


def test_two_sharded_trainers_survive_kills_and_resume_replicated(tmp_path: Path) -> None:
    out = tmp_path / "run"
    sets = ["live=false", "checkpoint_every=3", "graph.trainer_workers=2",
            "graph.zero_stage=1", "chaos.kill_worker_every_steps=2", "graph.groups_per_step=4",
            "gpus=4,5,6,7", "gpus_per_worker=1"]
    s = run(GRPO, sets=sets, out=out, steps=6, console=False).summary
    assert s["error"] is None and s["steps"] == 6 and s["chaos_kills"] >= 2
    # rollout, judge and two trainers on a GPU each; every replacement on a dead worker's
    first_four = list(s["local_gpus"].values())[:4]
    assert sorted(first_four) == ["4", "5", "6", "7"]
    assert len(s["local_gpus"]) >= 4 + s["chaos_kills"] - s["chaos_kills_unseen"]
    assert set(s["local_gpus"].values()) == {"4", "5", "6", "7"}
    assert s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    worlds = [r["train_world"] for r in read_metrics(out / "metrics.jsonl") if "train_world" in r]
    assert 2.0 in worlds  # (steps after a kill may run on the trainer left)
    # a trainer was among the killed (its replacement logs as ~rN): the state was re-cut
    assert list((out / "logs").glob("w*-trainer~r*.log"))
    assert optimizer_steps(out) == {6.0}  # one AdamW step a version, through every re-cut
    s = run(GRPO, sets=["graph.zero_stage=0"], out=out, steps=7, console=False,
            resume=str(out), accept_changes=True).summary  # (any graph knob asks)
    assert s["error"] is None and s["steps"] == 7
    assert optimizer_steps(out) == {7.0}
