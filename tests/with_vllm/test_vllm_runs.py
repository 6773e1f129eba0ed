"""Whole runs with vLLM workers (real worker processes, the built-in models as HF folders with
head_dim 32): every sample trained exactly once, vLLM in every generating role (rollout, GenRM
judge, multi-turn tool rollouts, a LoRA policy's and PPO's rollouts) or in one pool beside the
embedded engine, and a vLLM worker's shifts timed part by part.

Each run starts its own workers (and so its own vLLM engines), so there are few and short
ones. Skipped when vllm is not installed (the main environment).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from pivotflow.run import run  # noqa: E402

pytestmark = pytest.mark.timeout(1200)
ROOT = Path(__file__).resolve().parents[2]


def vllm_started(log: Path) -> bool:
    """Whether a worker's log holds vLLM's own log lines ("INFO 12-02 13:45:36 [file.py:N]";
    pivotflow's are "[w0-rollout] WARNING pivotflow...."): vLLM logs as it starts."""
    return re.search(r"(INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d \[\w+\.py:\d+\]",
                     log.read_text()) is not None  # fmt: skip


def test_the_genrm_graph_on_vllm_trains_every_sample_once(tmp_path: Path) -> None:
    # a worker SIGKILLed after steps 8 and 16 (chaos): its replacement starts vLLM again
    sets = ["engine=vllm", "live=false", "chaos.kill_worker_every_steps=8"]
    result = run(ROOT / "graphs" / "grpo_genrm.py", sets=sets, out=tmp_path / "out", steps=20,
                 console=False)  # fmt: skip
    s = result.summary
    assert s["error"] is None and s["steps"] == 20
    assert s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert s["ledger"]["groups_trained"] == 20 * 8 and s["generation_errors"] == 0
    assert s["chaos_kills"] == 2
    assert s["worker_restarts"] == s["chaos_kills"] - s["chaos_kills_unseen"]
    logs = {p.name.split("-", 1)[1]: p for p in (result.out / "logs").glob("w*.log")}  # not controller.log
    assert vllm_started(logs["rollout.log"]) and vllm_started(logs["genrm.log"])
    assert json.loads((result.out / "config.json").read_text())["engine"] == "vllm"


def test_a_vllm_rollout_beside_the_embedded_judge_shifts_timed(tmp_path: Path) -> None:
    # One worker time-shares rollout (vLLM) and trainer: each phase change is a shift of a
    # vLLM worker -- out of rollout it shuts vLLM down (release_s), into rollout it starts a
    # new one (warmup_s, inside load_s). The judge is the embedded engine on its own worker.
    sets = ["engine.rollout=vllm", "live=false", "planner=static", "colocate=rollout+trainer",
            "graph.groups_per_step=2", "graph.group_size=4", "graph.median_tokens=16"]
    result = run(ROOT / "graphs" / "grpo_genrm_longtail.py", sets=sets, out=tmp_path / "out",
                 workers=2, steps=2, console=False)  # fmt: skip
    s = result.summary
    assert s["error"] is None and s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert s["ledger"]["groups_trained"] == 4
    shifts = [json.loads(line) for line in (result.out / "shifts.jsonl").read_text().splitlines()]
    out_of = [x for x in shifts if x["from"] == "rollout"]
    into = [x for x in shifts if x["to"] == "rollout"]
    assert len(out_of) == 2 and len(into) == 1, shifts  # rollout, train, rollout, train
    for x in out_of:
        assert x["release_s"] > 0 and x["to"] == "trainer", x
    for x in into:
        assert 0 < x["warmup_s"] <= x["load_s"] <= x["total_s"], x
    logs = {p.name.split("-", 1)[1]: p for p in (result.out / "logs").glob("w*.log")}  # not controller.log
    assert vllm_started(logs["rollout.log"]) and not vllm_started(logs["genrm.log"])
    assert json.loads((result.out / "config.json").read_text())["engines"] == {"rollout": "vllm"}


def test_multi_turn_tool_rollouts_on_vllm(tmp_path: Path) -> None:
    # The tool policy calls the calculator on some prompts: a call ends at the stop string
    # "</tool_call>" (an added token, matched by vLLM's detokenizer); the next turn's prompt
    # is the prompt, the turns so far and the tool's observation, as token ids.
    result = run(ROOT / "graphs" / "agentic_tools.py", sets=["engine=vllm", "live=false"],
                 out=tmp_path / "out", steps=2, console=False)  # fmt: skip
    s = result.summary
    assert s["error"] is None and s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert s["generation_errors"] == 0 and s["tool_results"].get("ok", 0) > 0, s["tool_results"]
    steps = [json.loads(line) for line in (result.out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["tool_errors"] == 0 for r in steps)
    assert max(r["turns_mean"] for r in steps) > 1.0  # some samples took a second turn


def test_a_lora_policy_on_vllm(tmp_path: Path) -> None:
    # LoRA publishes the merged policy every step: vLLM loads it as any new version (each
    # step's rollouts need the version before it, max_staleness 0), and the run writes PEFT's
    # adapter folder beside the plain policy.
    sets = ["engine.rollout=vllm", "live=false", "graph.lora_rank=4", "graph.lr=3e-3",
            "checkpoint_every=3"]
    result = run(ROOT / "graphs" / "grpo_genrm.py", sets=sets, out=tmp_path / "out", steps=3,
                 console=False)  # fmt: skip
    s = result.summary
    assert s["error"] is None and s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert s["ledger"]["groups_trained"] == 3 * 8 and s["generation_errors"] == 0
    steps = [json.loads(line) for line in (result.out / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in steps] == [1, 2, 3]
    logs = {p.name.split("-", 1)[1]: p for p in (result.out / "logs").glob("w*.log")}
    assert vllm_started(logs["rollout.log"])
    adapter = result.out / "checkpoints" / "step-000003" / "adapter"
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4


def test_ppo_with_a_critic_on_vllm(tmp_path: Path) -> None:
    # vLLM serves the rollouts; the critic (a score role on the embedded forward) scores them
    # with the critic of each step, and the trainer steps both: the per-token advantages are
    # GAE's on vLLM's tokens.
    sets = ["engine.rollout=vllm", "live=false", "graph.groups_per_step=16"]
    result = run(ROOT / "graphs" / "ppo_genrm.py", sets=sets, out=tmp_path / "out", steps=3,
                 console=False)  # fmt: skip
    s = result.summary
    assert s["error"] is None and s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert s["ledger"]["samples_trained"] == 3 * 16 and s["generation_errors"] == 0
    steps = [json.loads(line) for line in (result.out / "metrics.jsonl").read_text().splitlines()]
    assert steps[0]["train_value_mean"] == 0.0  # the zero value head
    assert all(r["train_critic_grad_norm"] > 0 for r in steps)
    logs = {p.name.split("-", 1)[1]: p for p in (result.out / "logs").glob("w*.log")}
    assert vllm_started(logs["rollout.log"]) and not vllm_started(logs["values.log"])
