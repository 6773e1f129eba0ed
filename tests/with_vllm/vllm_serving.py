"""Serving a folder on vLLM as a rollout worker does, for the family tests: the store holds
the folder as pivotflow reads it, vLLM starts from the held config with random weights and
loads the store's version; ``greedy`` decodes PROMPTS on any engine, so vLLM's tokens and the
embedded engine's compare."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vllm_fixtures import EOS, MAX_LEN

from pivotflow.engines.base import GenerationRequest, SamplingParams
from pivotflow.params.shm_store import ShmParamStore

# the last prompt is 67 tokens: past the YaRN model's original 32
PROMPTS = [[5, 17, 40, 41, 9], [60, 61, 62], [100, 7, 7, 7, 7, 7, 7, 30], list(range(3, 70))]


def greedy(engine: Any) -> dict[str, list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=(EOS,))
    for i, p in enumerate(PROMPTS):
        engine.add_request(GenerationRequest(f"g{i}", list(p), params))
    got: dict[str, list[int]] = {}
    while engine.has_work():
        got.update((o.request_id, o.token_ids) for o in engine.step())
    return got


@contextmanager
def vllm_on_store(root: Path, path: Path,
                   dtype: str = "float32") -> Iterator[tuple[Any, ShmParamStore, Any]]:
    """(vLLM engine, store, the folder as held) for the folder ``path`` as a rollout worker
    serves it: the store holds its version 0 of "policy" (``held_config`` and tensors, as a
    run publishes them), vLLM starts with random weights from a folder of that config and the
    tokenizer (what generate_role writes) and has loaded the store's version."""
    from pivotflow.engines.torch.weights import load_model_folder
    from pivotflow.engines.vllm_engine import VllmEngine
    from pivotflow.params.hf_folder import CONFIG, copy_side_files

    held = load_model_folder(path)
    served = root / "served"
    served.mkdir()
    (served / CONFIG).write_text(json.dumps(held.hf_config))
    copy_side_files(path, served)
    store = ShmParamStore(root / "store")
    engine = None
    try:
        store.publish("policy", 0, held.tensors, held.hf_config)
        engine = VllmEngine(None, model_path=str(served), dtype=dtype,
                            max_model_len=MAX_LEN, load_format="dummy", threads=1)
        assert engine.load_from_store(store, "policy", 0) == 0
        yield engine, store, held
    finally:
        if engine is not None:
            engine.shutdown()
        store.cleanup()


def vllm_greedy(root: Path, path: Path) -> dict[str, list[int]]:
    """vLLM's greedy tokens on the folder ``path`` as a rollout worker serves it."""
    with vllm_on_store(root, path) as (engine, _, _):
        return greedy(engine)
