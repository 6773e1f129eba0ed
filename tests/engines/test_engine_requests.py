"""TorchEngine input checks, queueing, and memory release/resume."""

from __future__ import annotations

import dataclasses

import pytest
from engine_fixtures import CONFIG, TOKENIZER, req

from pivotflow.engines.base import GenerationRequest, SamplingParams
from pivotflow.engines.torch import TorchEngine
from pivotflow.errors import EngineError, RequestError

V = CONFIG.vocab_size
BAD = {
    "empty prompt": GenerationRequest("bad", [], SamplingParams()),
    "prompt longer than context": GenerationRequest("bad", [5] * 64, SamplingParams()),
    "token outside vocab": GenerationRequest("bad", [5, V], SamplingParams()),
    "negative token": GenerationRequest("bad", [5, -1], SamplingParams()),
    "prefix token outside vocab": GenerationRequest("bad", [5], SamplingParams(), [V], [0.0], [0]),
    "max_tokens zero": GenerationRequest("bad", [5], SamplingParams(max_tokens=0)),
    "prefix longer than max_tokens": GenerationRequest(
        "bad", [5], SamplingParams(max_tokens=2), [5, 6, 7], [0.0] * 3, [0] * 3
    ),
    "prefix logprobs length": GenerationRequest(
        "bad", [5], SamplingParams(), [5, 6], [0.0], [0, 0]
    ),
    "prefix versions length": GenerationRequest("bad", [5], SamplingParams(), [5], [0.0], []),
    "negative temperature": GenerationRequest("bad", [5], SamplingParams(temperature=-1.0)),
    "top_p zero": GenerationRequest("bad", [5], SamplingParams(top_p=0.0)),
    "stop token outside vocab": GenerationRequest("bad", [5], SamplingParams(stop_token_ids=(V,))),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_request_is_rejected_and_others_still_served(make, case: str) -> None:  # type: ignore[no-untyped-def]
    engine = make()
    engine.add_request(req("good", max_tokens=5))
    with pytest.raises(RequestError, match="'bad'"):
        engine.add_request(BAD[case])
    (out,) = engine.generate([req("good2", max_tokens=4)])
    assert out.request_id == "good2" and len(out.token_ids) == 4
    rest = engine.step()
    while engine.has_work():
        rest += engine.step()
    assert [o.request_id for o in rest] == ["good"] and len(rest[0].token_ids) == 5


def test_duplicate_id_and_stop_strings_without_detokenize(make) -> None:  # type: ignore[no-untyped-def]
    engine = make()
    engine.add_request(req("dup"))
    with pytest.raises(RequestError, match="'dup'.*duplicate"):
        engine.add_request(req("dup"))
    plain = make(detokenize=None)
    with pytest.raises(RequestError, match="'s'.*detokenize"):
        plain.add_request(req("s", stop_strings=("x",)))
    assert engine.generate([req("other", max_tokens=2)])[0].finish_reason == "length"


def test_a_full_batch_queues_instead_of_failing(make) -> None:  # type: ignore[no-untyped-def]
    engine = make(max_batch=2)
    outs = engine.generate([req(f"r{i}", max_tokens=3 + i) for i in range(7)])
    assert [len(o.token_ids) for o in outs] == [3 + i for i in range(7)]


def test_release_and_resume_memory(make, weights) -> None:  # type: ignore[no-untyped-def]
    engine = make()
    before = engine.generate([req("a", temperature=1.0, max_tokens=8, seed=3)])[0]
    engine.add_request(req("busy"))
    with pytest.raises(EngineError, match="in flight"):
        engine.release_memory()
    engine.abort("busy")
    engine.release_memory()
    assert engine._model is None and engine._cache is None
    with pytest.raises(EngineError, match="released"):
        engine.add_request(req("x"))
    engine.resume_memory()
    with pytest.raises(EngineError, match="load_weights"):
        engine.add_request(req("x"))
    engine.load_weights(weights, version=5)
    after = engine.generate([req("a", temperature=1.0, max_tokens=8, seed=3)])[0]
    assert after.token_ids == before.token_ids and after.versions == [5] * 8


def test_fresh_engine_refuses_to_serve_before_weights() -> None:
    engine = TorchEngine(CONFIG)
    with pytest.raises(EngineError, match="load_weights"):
        engine.add_request(req("x"))
    assert engine.step() == [] and not engine.has_work()


def test_engine_config_errors() -> None:
    with pytest.raises(EngineError, match="max_seq_len"):
        TorchEngine(CONFIG, max_seq_len=CONFIG.max_position_embeddings + 1)
    with pytest.raises(EngineError, match="max_batch"):
        TorchEngine(CONFIG, max_batch=0)


def test_generate_rejects_all_or_nothing(make) -> None:  # type: ignore[no-untyped-def]
    engine = make()
    bad = dataclasses.replace(req("b"), prompt_ids=[])
    with pytest.raises(RequestError, match="'b'"):
        engine.generate([req("a"), bad])
    assert not engine.has_work()


def test_min_tokens_keeps_stop_tokens_out_until_reached(make) -> None:  # type: ignore[no-untyped-def]
    engine = make()
    (free,) = engine.generate([req("free", max_tokens=12)])
    first = free.token_ids[0]
    stop = SamplingParams(temperature=0.0, max_tokens=12, seed=0, stop_token_ids=(first,))
    prompt = TOKENIZER.encode("ab", add_special_tokens=True)  # what req() sends
    (early,) = engine.generate([GenerationRequest("early", prompt, stop)])
    assert early.token_ids == [first] and early.finish_reason == "stop"
    held = dataclasses.replace(stop, min_tokens=6)
    (late,) = engine.generate([GenerationRequest("late", prompt, held)])
    assert len(late.token_ids) >= 6
    assert first not in late.token_ids[:5]  # the stop token was never sampled before 6 tokens
