"""vLLM with tensor parallelism (``--set tensor_parallel.POOL=2``): vLLM's CPU build runs each
rank as a process of its own, so the weight loads that cross ``collective_rpc`` reach both
ranks, each loading its half from the parameter store; greedy tokens equal the embedded
engine's after an update, and a run with a two-rank vLLM rollout trains every sample once.
Skipped when vllm is not installed (the main environment)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

from test_vllm_engine import PROMPTS, at, request, run, torch_engine  # noqa: E402
from vllm_fixtures import MAX_LEN, perturbed  # noqa: E402

from pivotflow.engines.vllm_engine import VllmEngine  # noqa: E402
from pivotflow.params.shm_store import ShmParamStore  # noqa: E402
from pivotflow.run import run as run_graph  # noqa: E402

pytestmark = pytest.mark.timeout(900)
ROOT = Path(__file__).resolve().parents[2]


def test_two_ranks_load_each_version_from_the_store_and_match_the_embedded_engine(
        folder: Path, store: ShmParamStore, weights: dict[str, torch.Tensor]) -> None:
    engine = VllmEngine(None, model_path=str(folder), dtype="float32", max_model_len=MAX_LEN,
                        load_format="dummy", threads=1, tensor_parallel_size=2)
    try:
        llm = engine._llm  # noqa: SLF001 (what vLLM was built with)
        parallel = llm.llm_engine.vllm_config.parallel_config
        assert (parallel.tensor_parallel_size, parallel.distributed_executor_backend) == (2, "mp")
        for version, tensors in ((1, perturbed(weights, 1)), (0, weights)):
            at(engine, store, version)
            ours = run(torch_engine(folder, tensors, version),
                       [request(f"t{version}-{i}", p) for i, p in enumerate(PROMPTS)])
            theirs = run(engine, [request(f"t{version}-{i}", p) for i, p in enumerate(PROMPTS)])
            for rid, o in ours.items():
                assert theirs[rid].token_ids == o.token_ids, rid
                assert theirs[rid].versions == [version] * len(o.token_ids)
    finally:
        engine.shutdown()


def test_a_run_with_a_two_rank_vllm_rollout_trains_every_sample_once(tmp_path: Path) -> None:
    sets = ["engine.rollout=vllm", "tensor_parallel.rollout=2", "live=false",
            "graph.groups_per_step=4"]
    result = run_graph(ROOT / "graphs" / "grpo_genrm.py", sets=sets, out=tmp_path / "out",
                       steps=3, console=False)
    s = result.summary
    assert s["error"] is None and s["steps"] == 3 and s["generation_errors"] == 0
    assert s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert json.loads((result.out / "config.json").read_text())["tensor_parallels"] == \
        {"rollout": 2}
    log = next((result.out / "logs").glob("w*-rollout.log")).read_text()
    assert "Worker_TP1" in log  # vLLM's second rank ran (its log lines name it)
