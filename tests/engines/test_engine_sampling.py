"""Sampling: counter-based noise, the distribution it draws from, top-p, raw logprobs."""

from __future__ import annotations

import pytest
import torch

from pivotflow.engines.base import SamplingParams
from pivotflow.engines.torch.sampling import SlotSampler, gumbel_noise, seed_key, top_p_filter


def test_noise_is_a_pure_function_of_key_and_index() -> None:
    keys = torch.tensor([seed_key(1), seed_key(1), seed_key(2)])
    a = gumbel_noise(keys, torch.tensor([5, 5, 5]), 50)
    b = gumbel_noise(keys[[0]], torch.tensor([5]), 50)
    assert torch.equal(a[0], a[1]) and torch.equal(a[0], b[0])  # alone or batched: same draw
    assert not torch.equal(a[0], a[2])  # another seed
    assert not torch.equal(a[0], gumbel_noise(keys[:1], torch.tensor([6]), 50)[0])  # next index
    assert seed_key(None) != seed_key(None)  # no seed: a fresh random one
    assert torch.isfinite(a).all()


def test_gumbel_max_draws_from_the_tempered_softmax() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 1.5])
    temperature = 0.8
    n = 20000
    keys = torch.full((n,), seed_key(7))
    noise = gumbel_noise(keys, torch.arange(n), logits.numel())
    draws = (logits / temperature + noise).argmax(-1)
    freq = torch.bincount(draws, minlength=5).float() / n
    expected = torch.softmax(logits / temperature, -1)
    assert torch.allclose(freq, expected, atol=0.015)


def test_top_p_keeps_the_smallest_nucleus() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05], [0.9, 0.05, 0.03, 0.02]])
    kept = top_p_filter(probs.log(), torch.tensor([0.75, 1.0, 0.5])) > float("-inf")
    assert kept.tolist() == [[True, True, False, False], [True] * 4, [True, False, False, False]]


def test_slot_sampler_greedy_sampled_and_raw_logprobs() -> None:
    sampler = SlotSampler(3, "cpu")
    sampler.set(0, SamplingParams(temperature=0.0), seed_key(1))
    sampler.set(1, SamplingParams(temperature=5.0), seed_key(1))
    sampler.set(2, SamplingParams(temperature=5.0, top_p=0.1), seed_key(2))
    logits = torch.tensor([[0.0, 3.0, 1.0, 0.5]]).repeat(3, 1)
    seen, first_draw = set(), None
    for i in range(40):
        tokens, logprobs = sampler.sample(logits, 0, torch.full((3,), i))
        assert tokens[0] == 1 and tokens[2] == 1  # greedy; top-p 0.1 keeps only the argmax
        seen.add(int(tokens[1]))
        first_draw = int(tokens[1]) if i == 0 else first_draw
        raw = torch.log_softmax(logits[0], -1)  # logprobs ignore temperature and top-p
        assert logprobs.tolist() == pytest.approx(raw[tokens].tolist(), abs=1e-6)
    assert len(seen) > 2  # temperature 5 spreads the draws
    sampler.move(1, 0)  # slot 0 now holds slot 1's request: same draws at the same index
    assert sampler.sample(logits[:1], 0, torch.tensor([0]))[0].item() == first_draw
