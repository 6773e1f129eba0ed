"""TorchEngine: continuous batching, streaming, resume determinism, logprobs, stops, versions."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine_fixtures import CONFIG, TOKENIZER, mixed_requests, req, tiny_weights

from pivotflow.engines.base import GenerationOutput, GenerationRequest
from pivotflow.engines.torch import Decoder, token_logprobs


def alone(make, request: GenerationRequest) -> GenerationOutput:  # type: ignore[no-untyped-def]
    return make(max_batch=1).generate([request])[0]


def assert_same(a: GenerationOutput, b: GenerationOutput) -> None:
    assert a.token_ids == b.token_ids
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert a.finish_reason == b.finish_reason


def test_batched_equals_one_at_a_time(make) -> None:  # type: ignore[no-untyped-def]
    requests = mixed_requests()
    batched = make(max_batch=4).generate(requests)  # 4 slots: the rest wait and join later
    for request, out in zip(requests, batched, strict=True):
        assert out.request_id == request.request_id
        assert_same(out, alone(make, request))
    sampled = [o for r, o in zip(requests, batched, strict=True) if r.params.temperature > 0]
    assert len({tuple(o.token_ids) for o in sampled}) == len(sampled)  # seeds differ, draws too


def test_requests_join_while_others_run(make) -> None:  # type: ignore[no-untyped-def]
    engine = make(max_batch=8)
    first = req("long", "hello", temperature=1.0, max_tokens=30, seed=5)
    engine.add_request(first)
    for _ in range(4):
        assert engine.step() == []
    late = [req("late0", "ab", max_tokens=10), req("late1", "xy", temperature=0.8, seed=9)]
    outs = {o.request_id: o for o in engine.generate(late)}
    while engine.has_work():
        outs.update({o.request_id: o for o in engine.step()})
    for request in [first, *late]:
        assert_same(outs[request.request_id], alone(make, request))


def test_short_request_streams_out_before_long_one(make) -> None:  # type: ignore[no-untyped-def]
    engine = make()
    engine.add_request(req("long", max_tokens=40))
    engine.add_request(req("short", max_tokens=3))
    finished_at: dict[str, int] = {}
    step = 0
    while engine.has_work():
        step += 1
        for out in engine.step():
            finished_at[out.request_id] = step
    assert finished_at["short"] < finished_at["long"]
    assert finished_at["short"] <= 2  # 3 tokens: prefill + decode in step 1, one more in step 2


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_abort_then_resume_elsewhere_matches_uninterrupted(make, temperature: float) -> None:  # type: ignore[no-untyped-def]
    request = req("r", "the cat", temperature=temperature, top_p=0.95, max_tokens=24, seed=42)
    full = alone(make, request)
    first = make(version=1, max_batch=4)
    first.add_request(request)
    first.add_request(req("companion", "zz", temperature=1.0, max_tokens=40, seed=1))
    for _ in range(5):
        first.step()
    partial = first.abort("r")
    assert partial is not None and partial.finish_reason == "abort"
    k = len(partial.token_ids)
    assert 0 < k < len(full.token_ids)
    assert partial.token_ids == full.token_ids[:k] and partial.versions == [1] * k
    resumed_req = dataclasses.replace(
        request,
        prefix_ids=partial.token_ids,
        prefix_logprobs=partial.logprobs,
        prefix_versions=partial.versions,
    )
    second = make(version=2, max_batch=3)  # a fresh engine with other companions
    others = [req("o1", "12+34=", temperature=0.9, seed=3), req("o2", "q", max_tokens=30)]
    resumed = second.generate([others[0], resumed_req, others[1]])[1]
    assert_same(resumed, full)
    assert resumed.logprobs[:k] == partial.logprobs  # the prefix is carried, not recomputed
    assert resumed.versions == [1] * k + [2] * (len(full.token_ids) - k)


def test_logprobs_match_a_full_forward_pass(make, weights) -> None:  # type: ignore[no-untyped-def]
    model = Decoder(CONFIG)
    model.load_state_dict(weights)
    requests = mixed_requests()
    for request, out in zip(requests, make(max_batch=5).generate(requests), strict=True):
        ids = torch.tensor([request.prompt_ids + out.token_ids])
        with torch.no_grad():
            expected = token_logprobs(model(ids)[:, :-1], ids[:, 1:])[0]
        expected = expected[len(request.prompt_ids) - 1 :]
        assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4)


def test_stop_token_eos_and_stop_string(make) -> None:  # type: ignore[no-untyped-def]
    base = alone(make, req("r", "hello", max_tokens=20))
    ids = base.token_ids
    stop_id = ids[5]
    cut = ids.index(stop_id) + 1
    by_stop_id = alone(make, req("r", "hello", max_tokens=20, stop_token_ids=(stop_id,)))
    assert by_stop_id.token_ids == ids[:cut] and by_stop_id.finish_reason == "stop"
    by_eos = make(max_batch=1, eos_token_id=stop_id).generate([req("r", "hello", max_tokens=20)])
    assert by_eos[0].token_ids == ids[:cut] and by_eos[0].finish_reason == "stop"
    text = TOKENIZER.decode(ids)
    needle = text[6:8]
    end = text.index(needle) + len(needle)
    by_string = alone(make, req("r", "hello", max_tokens=20, stop_strings=("@@@", needle)))
    assert TOKENIZER.decode(by_string.token_ids) == text[:end]
    assert by_string.finish_reason == "stop"
    assert base.finish_reason == "length" and len(ids) == 20


def test_max_tokens_counts_the_prefix_and_context_clamps(make) -> None:  # type: ignore[no-untyped-def]
    full = alone(make, req("r", "ab", max_tokens=10))
    resumed = dataclasses.replace(
        req("r", "ab", max_tokens=10),
        prefix_ids=full.token_ids[:4],
        prefix_logprobs=full.logprobs[:4],
        prefix_versions=[0] * 4,
    )
    out = alone(make, resumed)
    assert out.token_ids == full.token_ids and out.finish_reason == "length"
    prompt = "x" * 50  # 51 tokens with bos; the context is 64
    clamped = alone(make, req("c", prompt, max_tokens=1000))
    assert len(clamped.token_ids) == 64 - 51 and clamped.finish_reason == "length"
    done = dataclasses.replace(
        req("d", "ab", max_tokens=4),
        prefix_ids=full.token_ids[:4],
        prefix_logprobs=full.logprobs[:4],
        prefix_versions=[7] * 4,
    )
    assert alone(make, done).token_ids == full.token_ids[:4]  # nothing left: finishes at once


def test_tokens_after_a_weight_load_carry_the_new_version(make) -> None:  # type: ignore[no-untyped-def]
    engine = make(version=3)
    engine.add_request(req("r", "hello", temperature=1.0, max_tokens=20, seed=1))
    for _ in range(4):
        engine.step()
    engine.load_weights(tiny_weights(seed=1), version=4)
    while not (done := engine.step()):
        pass
    versions = done[0].versions
    k = versions.index(4)
    assert 0 < k < len(versions) and versions == [3] * k + [4] * (len(versions) - k)


def test_abort_all_returns_waiting_and_running(make) -> None:  # type: ignore[no-untyped-def]
    engine = make(max_batch=2)
    for i in range(4):
        engine.add_request(req(f"r{i}", max_tokens=30))
    engine.step()
    outs = engine.abort_all()
    assert sorted(o.request_id for o in outs) == ["r0", "r1", "r2", "r3"]
    assert all(o.finish_reason == "abort" for o in outs)
    assert sum(len(o.token_ids) > 0 for o in outs) == 2  # two ran, two were still waiting
    assert not engine.has_work() and engine.abort("r0") is None
    assert engine.generate([req("r0", max_tokens=3)])[0].finish_reason == "length"


def test_a_resumed_prefix_is_prefilled_apart_from_short_prompts(make, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A sequence resumed from a long prefix joins beside fresh prompts (a partial rollout's
    carry, a migration): the prompts are not padded to the prefix's length (a real run spent
    1-2 s a boundary on that), and every output is the one it gets alone."""
    from pivotflow.batching import prefill_groups
    from pivotflow.engines.torch.slot_cache import SlotKVCache

    long = req("long", "the cat", temperature=1.0, max_tokens=50, seed=7)
    full = alone(make, long)
    k = 40
    resumed = dataclasses.replace(long, prefix_ids=full.token_ids[:k],
                                  prefix_logprobs=full.logprobs[:k],
                                  prefix_versions=full.versions[:k])
    fresh = [req(f"f{i}", "ab", temperature=[0.0, 1.0][i % 2], max_tokens=8, seed=i)
             for i in range(6)]
    shapes: list[tuple[int, int]] = []
    begin = SlotKVCache.begin_prefill

    def recorded(self, start, lengths):  # type: ignore[no-untyped-def]
        shapes.append((len(lengths), max(lengths)))
        return begin(self, start, lengths)

    monkeypatch.setattr(SlotKVCache, "begin_prefill", recorded)
    outs = make(max_batch=8).generate([*fresh[:3], resumed, *fresh[3:]])
    real = sum(len(r.prompt_ids) for r in fresh) + len(long.prompt_ids) + k
    assert shapes == [(6, 3), (1, len(long.prompt_ids) + k)]  # one pass per length group
    assert sum(n * w for n, w in shapes) < 2 * real  # in one pass: 7 x 47 = 329 for 65 tokens
    by_id = {o.request_id: o for o in outs}
    assert_same(by_id["long"], full)
    for r in fresh:
        assert_same(by_id[r.request_id], alone(make, r))
    # the groups: sorted lengths, each at most twice its first or 32 tokens past it
    assert prefill_groups([6] * 63 + [449]) == [(0, 63), (63, 64)]
    assert prefill_groups([3, 10, 30, 35, 36, 80, 150, 161]) == [(0, 4), (4, 5), (5, 7), (7, 8)]
    assert prefill_groups([5]) == [(0, 1)]
