from __future__ import annotations

import random

import pytest

from pivotflow.errors import TokenizerError
from pivotflow.sim.tokens import SimProblems, SimTokenizer
from pivotflow.tokenizer import default_tokenizer


def test_sim_tokenizer_matches_char_tokenizer() -> None:
    ref, fast = default_tokenizer(), SimTokenizer()
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(ref.vocab_size) for _ in range(rng.randrange(0, 300))]
        text = ref.decode(ids)
        assert fast.decode(ids) == text
        assert fast.encode(text, add_special_tokens=True) == ref.encode(text, add_special_tokens=True)
        assert fast.decode(ids, skip_special=False) == ref.decode(ids, skip_special=False)


@pytest.mark.parametrize("text", ["ab\x01", "caf\u00e9", "x\x7f"])
def test_sim_tokenizer_rejects_unknown_characters(text: str) -> None:
    with pytest.raises(TokenizerError, match="not in the alphabet"):
        SimTokenizer().encode(text)


@pytest.mark.parametrize("ids", [[3, 99], [3, -1], [256]])
def test_sim_tokenizer_rejects_out_of_range_ids(ids: list[int]) -> None:
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        SimTokenizer().decode(ids)


def test_sim_problems_lengths_follow_the_spec() -> None:
    probs = SimProblems(median_tokens=100, sigma=0.5, cap=300, seed=1)
    lens = sorted(len(probs.next().prompt) for _ in range(2001))
    assert probs.cursor == 2001
    assert 90 <= lens[1000] <= 110
    assert lens[-1] <= 300
    assert probs.check("", "anything") is None
