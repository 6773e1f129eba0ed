"""A Qwen3-MoE policy on vLLM (CPU build), against the embedded engine, in fp32: the same
greedy tokens from the store's first version, and after an update to the next one (the Hub's
per-expert tensor names reach vLLM's fused experts through its own loader).

Its own vLLM engine (a second start, ~20 s), started while the session's shared one (a dense
Qwen2, in this process) runs, as in a worker whose dense role shifted to an MoE policy: vLLM
makes its expert-parallel group only for a process's first engine, so an in-process MoE engine
after a dense one failed to start ("expert parallel group is not initialized"); an MoE engine
runs in a process of its own (``VllmEngine``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from vllm_fixtures import EOS, MAX_LEN, perturbed, save_sharpened  # noqa: E402

from pivotflow.engines.base import GenerationOutput, GenerationRequest, SamplingParams  # noqa: E402
from pivotflow.engines.torch.engine import TorchEngine  # noqa: E402
from pivotflow.engines.torch.weights import load_checkpoint  # noqa: E402
from pivotflow.params.shm_store import ShmParamStore  # noqa: E402

pytestmark = pytest.mark.timeout(900)

PROMPTS = [[5, 17, 40, 41, 9], [60, 61, 62], [100, 7, 7, 7, 7, 7, 7, 30], [250]]


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory: pytest.TempPathFactory, folder: Path) -> Path:
    """The session's tokenizer beside a random Qwen3-MoE (8 experts, 2 per token, 4 heads of
    32; layer 1 of 3 dense) that transformers saved."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=vocab, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1],
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=MAX_LEN, eos_token_id=EOS, bos_token_id=EOS))  # fmt: skip
    return save_sharpened(model, tmp_path_factory.mktemp("qwen3-moe"), folder)


@pytest.fixture(scope="module")
def moe_store(tmp_path_factory: pytest.TempPathFactory, moe_folder: Path) -> Iterator[Any]:
    cfg, weights = load_checkpoint(moe_folder)
    s = ShmParamStore(tmp_path_factory.mktemp("moe-store"))
    hf = json.loads((moe_folder / "config.json").read_text())
    s.publish("policy", 0, weights, hf)
    s.publish("policy", 1, perturbed(weights, 1), hf)
    yield s, cfg, weights
    s.cleanup()


def _run(engine: Any, prompts: list[list[int]]) -> dict[str, GenerationOutput]:
    params = SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=(EOS,))
    for i, p in enumerate(prompts):
        engine.add_request(GenerationRequest(f"g{i}", list(p), params))
    got: dict[str, GenerationOutput] = {}
    while engine.has_work():
        got.update((o.request_id, o) for o in engine.step())
    return got


def test_a_moe_policy_on_vllm_decodes_as_the_embedded_engine_before_and_after_an_update(
    moe_folder: Path, moe_store: Any, vllm_engine: Any
) -> None:
    from pivotflow.engines.vllm_engine import VllmEngine

    store, cfg, weights = moe_store
    assert cfg.architecture == "qwen3_moe" and cfg.num_experts == 8
    engine = VllmEngine(None, model_path=str(moe_folder), dtype="float32",
                        max_model_len=MAX_LEN, load_format="dummy", threads=1)  # fmt: skip
    try:
        for version, tensors in ((0, weights), (1, perturbed(weights, 1))):
            assert engine.load_from_store(store, "policy", version) == version
            ours = TorchEngine(cfg, max_batch=8, eos_token_id=EOS)
            ours.load_weights(tensors, version)
            expected = _run(ours, PROMPTS)
            got = _run(engine, PROMPTS)
            for rid, o in expected.items():
                assert got[rid].token_ids == o.token_ids, (version, rid)
                assert got[rid].versions == [version] * len(o.token_ids)
            assert max(len(o.token_ids) for o in expected.values()) == 20
    finally:
        engine.shutdown()


def test_experts_vllms_cpu_build_pads_are_one_line_before_it_starts(
    tmp_path: Path, moe_folder: Path
) -> None:
    """vLLM's CPU experts pad their width to a multiple of 32, and its in-place reload then
    failed in its worker ("The size of tensor a (128) must match the size of tensor b (96)",
    experts 48 wide, on the first load from the store): named, with the folder, first."""
    from pivotflow.engines.vllm_engine import VllmEngine
    from pivotflow.errors import EngineError

    config = json.loads((moe_folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "moe_intermediate_size": 48}))
    with pytest.raises(EngineError) as err:
        VllmEngine(None, model_path=str(tmp_path), max_model_len=MAX_LEN, load_format="dummy",
                   threads=1)
    assert str(err.value) == (
        f"{tmp_path / 'config.json'}: experts 48 wide: vLLM's CPU build pads them to a "
        "multiple of 32 and then cannot load the store's weights in place; serve this model "
        "with engine='torch', or vLLM on a GPU")
