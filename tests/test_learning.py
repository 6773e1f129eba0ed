"""End to end with the built-in models: GRPO with the GenRM raises rule-checked accuracy.

The first test to ask for the built-in models bootstraps them into the cache (minutes, once);
later runs reuse them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from script_modules import load_script

from pivotflow.metrics import read_metrics
from pivotflow.run import run

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(900)
def test_grpo_genrm_learns_end_to_end(tmp_path: Path) -> None:
    """The README's main command as it ships (the full task, default settings, 200 steps):
    through rollout workers, the judge's verdicts, GRPO and weight sync, rule-checked accuracy
    rises by issue 21's 0.15 at least. The run is seeded and deterministic."""
    result = run(ROOT / "graphs" / "grpo_genrm.py", sets=["live=false"], out=tmp_path / "run",
                 console=False)
    s = result.summary
    assert s["steps"] == 200
    assert s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert s["ledger"]["groups_trained"] == 200 * 8
    steps = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert steps[-1]["judge_failures"] < 0.05 * 200 * 64  # the judge's verdicts parse
    # every step reports the policy's entropy (nats per token, under ln of the vocabulary)
    assert all(0 < r["train_entropy"] < 12 for r in steps), [r.get("train_entropy") for r in steps]
    # `pivotflow run graphs/grpo_genrm.py` (lr 3e-5) on the BPE built-in models measured
    # 0.378 -> 0.595 (+0.216), the same figures on a quiet and on a loaded machine (55 s / 134 s
    # wall); the margin leaves room for a small change of numerics, not for a policy that stalls.
    assert s["task_accuracy_gain"] >= 0.18, s


@pytest.mark.timeout(600)
def test_agentic_tools_learns_to_call_the_calculator(tmp_path: Path) -> None:
    """graphs/agentic_tools.py as it ships, cut to 60 steps to fit CI: the BPE tool policy's
    Hermes calls are stopped on </tool_call>, answered by the calculator in the tool pool,
    appended as tokenized observations and masked out of the loss, and RL raises both how often
    it calls and how often it is right. The full 200 steps measured 0.484 -> 0.905 (+0.42) and
    calls 0.23 -> 0.86 (first/last tenth) in ~350 s on a loaded machine."""
    out = tmp_path / "run"
    result = run(ROOT / "graphs" / "agentic_tools.py", sets=["live=false"], steps=60, out=out,
                 console=False)
    s = result.summary
    assert s["steps"] == 60 and s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    steps = read_metrics(out / "metrics.jsonl")
    k = len(steps) // 10
    use_start = sum(r["tool_use_rate"] for r in steps[:k]) / k
    use_end = sum(r["tool_use_rate"] for r in steps[-k:]) / k
    # `pivotflow run graphs/agentic_tools.py --steps 60` measured accuracy 0.453 -> 0.654
    # (+0.201) and samples that call 0.195 -> 0.424 (deterministic: the 200-step run's first
    # 60 steps are the same step for step), ~112 s wall on a loaded machine.
    assert s["task_accuracy_gain"] >= 0.15, s
    assert use_end >= use_start + 0.12, (use_start, use_end)
    assert s["tool_results"].get("ok", 0) > 1000, s["tool_results"]  # calls ran, not failed


def test_rloo_filter_example_runs(tmp_path: Path) -> None:
    result = run(ROOT / "examples" / "rloo_filter.py", sets=["live=false"], steps=5,
                 out=tmp_path / "rloo", console=False)
    s = result.summary
    assert s["steps"] == 5 and s["ledger"]["lost"] == 0
    # every trained group had signal; the ones without were dropped and replaced
    assert s["ledger"]["prompts_in"] == s["ledger"]["groups_trained"] + s["groups_filtered"]
    assert s["groups_filtered"] > 0


def test_dataset_prompts_example_learns_from_its_parquet_table(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("dataset_prompts",
                                                  ROOT / "examples" / "dataset_prompts.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    data = example.write_table(tmp_path / "data.parquet")
    result = run(ROOT / "examples" / "dataset_prompts.py", steps=60, out=tmp_path / "run",
                 sets=["live=false", f"graph.data={data}"], console=False)
    s = result.summary
    assert s["ledger"]["lost"] == 0 and s["ledger"]["groups_trained"] == 60 * 8
    # the reward read each row's data_source and ground truth (the exact rule agrees with it),
    # and GRPO on it moved the policy: measured 0.38 -> 0.46 over 60 steps (deterministic)
    steps = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert all(r["reward_mean"] == pytest.approx(r["task_accuracy"]) for r in steps)
    assert s["task_accuracy_gain"] >= 0.04, s
    # the verl dict's other key (carry: whether the row's sum carries) is logged each step
    carry = [r["field_means"]["carry"] for r in steps]
    assert all(0.0 <= c <= 1.0 for c in carry) and 0.0 < sum(carry) / len(carry) < 1.0


def test_trl_rewards_example_sums_its_functions_as_trl_does_and_learns(tmp_path: Path) -> None:
    """examples/trl_rewards.py: two TRL reward functions with weights 1 and 0.2, the second
    None on right answers. Each step's reward is then exactly accuracy plus 0.2 times the
    format reward's mean over the wrong ones (a None leaves its term out, as TRL's nansum), and
    GRPO on it moves the policy: measured 0.365 -> 0.435 over 60 steps (deterministic)."""
    result = run(ROOT / "examples" / "trl_rewards.py", steps=60, out=tmp_path / "run",
                 sets=["live=false"], console=False)
    s = result.summary
    assert s["ledger"]["lost"] == 0 and s["ledger"]["groups_trained"] == 60 * 8
    for r in read_metrics(tmp_path / "run" / "metrics.jsonl"):
        acc, means = r["task_accuracy"], r["field_means"]
        assert means["reward_accuracy_reward"] == pytest.approx(acc)
        wrong = means.get("reward_format_reward", 0.0)  # (absent: every answer right)
        assert r["reward_mean"] == pytest.approx(acc + 0.2 * wrong * (1 - acc))
    assert s["task_accuracy_gain"] >= 0.04, s


def test_openrlhf_remote_rm_example_trains_on_a_reward_servers_rewards(tmp_path: Path) -> None:
    """examples/openrlhf_remote_rm.py against examples/reward_server.py on loopback (5 ms a
    request): every reward came from the server (its rule is the task's exact check, so each
    step's reward_mean is its task_accuracy), its extra_logs are each step's logged_metrics,
    and requests overlapped. (Learning is measured, not asserted here: 0.365 -> 0.435 over
    60 steps with the server in process; the async calls' order moves a short run's curve, and
    trl_rewards' test asserts learning on the same reward.)"""
    server = load_script(ROOT / "examples" / "reward_server.py").serve_in_thread(
        latency_s=0.005)
    try:
        result = run(ROOT / "examples" / "openrlhf_remote_rm.py", steps=20,
                     out=tmp_path / "run", console=False,
                     sets=["live=false", f"graph.reward_url={server.url()}"])
    finally:
        server.shutdown()
        server.server_close()
    s = result.summary
    assert s["ledger"]["lost"] == 0 and s["ledger"]["groups_trained"] == 20 * 8
    assert server.queries == 20 * 64 and server.most_at_once > 1
    for r in read_metrics(tmp_path / "run" / "metrics.jsonl"):
        assert r["reward_mean"] == pytest.approx(r["task_accuracy"])
        assert 1.0 <= r["logged_metrics"]["response_chars"] <= 6.0


def test_a_judge_behind_an_api_gives_a_pool_judges_rewards(tmp_path: Path) -> None:
    """examples/api_judge.py, the built-in judge behind examples/openai_server.py (a process of
    its own) and awaited, against graphs/grpo_genrm.py's judge in a pool: the same template,
    parser and greedy decoding, so every step's reward is the same to the digit (measured:
    60 of 60 steps, accuracy 0.357 -> 0.440 in both; 6 here)."""
    from pivotflow.tasks.cache import ensure_models

    example = load_script(ROOT / "examples" / "api_judge.py")
    server, url = example.start_judge_server(ensure_models(seed=0)[1])
    try:
        api = run(ROOT / "examples" / "api_judge.py", steps=6, out=tmp_path / "api",
                  console=False, sets=["live=false", f"graph.judge_url={url}"])
    finally:
        server.terminate()
        server.wait()
    run(ROOT / "graphs" / "grpo_genrm.py", steps=6, out=tmp_path / "pool",
        console=False, sets=["live=false"])
    assert api.summary["ledger"]["lost"] == 0
    by_api, by_pool = (read_metrics(tmp_path / d / "metrics.jsonl") for d in ("api", "pool"))
    assert [r["reward_mean"] for r in by_api] == [r["reward_mean"] for r in by_pool]
    assert all(r["field_means"]["judge_failed"] == 0.0 for r in by_api)


def test_dapo_example_shapes_rewards_by_length_and_trains_only_uncut_responses(
        tmp_path: Path) -> None:
    """examples/dapo.py with a cap of 4 tokens (some answers and their EOS do not fit): every
    trained reward is the judge's 0 or 1 less the overlong penalty of its length, and each step
    trains exactly the tokens of the responses that ended on a stop token."""
    from pivotflow.metrics import read_metrics

    out = tmp_path / "dapo"
    result = run(ROOT / "examples" / "dapo.py", steps=4, out=out, console=False,
                 sets=["live=false", "log_samples=-1", "graph.max_tokens=4",
                       "graph.decoupled_loss=true"])
    s = result.summary
    assert s["steps"] == 4 and s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    samples, steps = read_metrics(out / "samples.jsonl"), read_metrics(out / "metrics.jsonl")
    assert any(x["finish_reason"] == "length" for x in samples)  # the cap cut some
    for x in samples:  # penalty 0.5 x the share of the last 2 tokens before the cap reached
        if x["reward"] is None:  # (a verdict the parser could not read stays None)
            continue
        penalty = 0.5 * min(1.0, max(0, x["response_tokens"] - 2) / 2)
        judged = x["reward"] + penalty
        assert min(abs(judged), abs(judged - 1.0)) < 1e-9, x
    for rec in steps:
        mine = [x for x in samples if x["step"] == rec["step"]]
        assert rec["train_tokens"] == sum(x["response_tokens"] for x in mine
                                          if x["finish_reason"] == "stop")
        assert rec["response_clip_ratio"] == pytest.approx(
            sum(x["finish_reason"] == "length" for x in mine) / len(mine))
        assert "train_behavior_weight_mean" in rec  # the decoupled loss ran
