"""Incremental detokenization: the pushes add up to decode(all ids), whatever the split of
characters over byte-level tokens; stop strings and tool-call tags that straddle tokens are
found in the streamed text."""

from __future__ import annotations

import json
import random

import pytest
from tok_fixtures import SPECIALS, train_bpe
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from pivotflow.tokenizer import HFTokenizer, StopScanner, default_tokenizer
from pivotflow.tokenizer import Tokenizer as TokenizerProtocol

PIECES = ["hello", " world", " 123", "4", ".", "\n", "中文", "分词器", "🎉", "👍🏽", "🦄",
          "café", " naïve", "<|im_start|>", "<|im_end|>", "Привет", "{\"a\": 1}", " ", "€"]


def random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 30))) for _ in range(n)]


def metaspace_tokenizer() -> Tokenizer:
    """SentencePiece-style: '▁' marks spaces, decoding strips the leading one, and a
    character outside the vocabulary falls back to one <0xNN> token per byte."""
    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback(),
                                     decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(random_texts(200, seed=1), trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for b in range(256):  # the byte pieces are ordinary vocabulary, as in SentencePiece
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    return Tokenizer.from_str(json.dumps(data))


@pytest.fixture(scope="module", params=["byte_level", "metaspace"])
def hf(request: pytest.FixtureRequest) -> HFTokenizer:
    backend = train_bpe() if request.param == "byte_level" else metaspace_tokenizer()
    return HFTokenizer.from_parts(backend, eos_token="<|im_end|>")


def pushed(tok: TokenizerProtocol, ids: list[int], sizes: list[int], skip: bool) -> str:
    stream = tok.stream(skip_special=skip)
    out, i = [], 0
    for n in sizes:
        out.append(stream.push(ids[i:i + n]))
        i += n
    out.append(stream.finish())
    assert "".join(out) == stream.text
    return stream.text


@pytest.mark.parametrize("skip", [True, False])
def test_one_at_a_time_equals_decode(hf: HFTokenizer, skip: bool) -> None:
    split_chars = 0
    for text in random_texts(150):
        ids = hf.encode(text + " ξ🐙")  # not in the training text: split into bytes
        split_chars += sum("\ufffd" in hf.decode([i]) for i in ids)
        stream = hf.stream(skip_special=skip)
        got = "".join([stream.push([i]) for i in ids])
        assert got == hf.decode(ids, skip_special=skip), text
        assert got.endswith("ξ🐙")
        assert stream.finish() == ""
    assert split_chars > 0  # the texts do split characters over tokens


def test_any_chunking_equals_decode(hf: HFTokenizer) -> None:
    rng = random.Random(2)
    for text in random_texts(100, seed=3):
        ids = hf.encode(text)
        sizes = []
        while sum(sizes) < len(ids):
            sizes.append(rng.randrange(1, 6))
        assert pushed(hf, ids, sizes, True) == hf.decode(ids)


def test_incomplete_character_is_held_until_complete() -> None:
    tok = HFTokenizer.from_parts(train_bpe(), eos_token="<|im_end|>")
    ids = tok.encode("🦄")  # not in the training text: its 4 bytes take several tokens
    assert len(ids) >= 2
    stream = tok.stream()
    assert [stream.push([i]) for i in ids] == [""] * (len(ids) - 1) + ["🦄"]
    cut = tok.stream()
    assert cut.push(ids[:2]) == "" and cut.finish() == tok.decode(ids[:2])  # ends in U+FFFD


def test_char_tokenizer_streams_each_token() -> None:
    tok = default_tokenizer()
    ids = tok.encode("1+1=2\n", add_special_tokens=True) + [tok.eos_id]
    assert pushed(tok, ids, [1] * len(ids), True) == "1+1=2\n"
    assert pushed(tok, ids, [2] * len(ids), False) == "<bos>1+1=2\n<eos>"


@pytest.mark.parametrize("stop", ["</tool_call>", "42.", "🎉!", "\n\n"])
def test_stop_strings_that_straddle_tokens_are_found(hf: HFTokenizer, stop: str) -> None:
    text = 'Thinking 1 2 3 🦄 <tool_call>\n{"name": "calc"}  is 42.🎉!\n\n</tool_call> tail'
    ids = hf.encode(text)
    stream, scan = hf.stream(), StopScanner(["never", stop])
    for n, i in enumerate(ids):
        found = scan.feed(stream.push([i]))
        if stop in stream.text:  # the push that completes the stop is the one that finds it
            assert found == (text.index(stop), stop)
            # how many tokens the stop spans (a SentencePiece-style vocabulary has "\n\n" whole)
            span = n + 1 - max(k for k in range(n + 1) if stop in hf.decode(ids[k:n + 1]))
            assert span >= 2 or stop == "\n\n"
            return
        assert found is None
    pytest.fail(f"{stop!r} never appeared")


def test_stop_scanner_finds_the_earliest_stop() -> None:
    scan = StopScanner(["END", "</tool_call>"])
    assert scan.feed("call </tool") is None
    assert scan.feed("_ca") is None
    assert scan.feed("ll> and END") == (5, "</tool_call>")
    assert scan.feed("more") == (5, "</tool_call>")
    both = StopScanner(["bc", "abcd"])
    assert both.feed("xab") is None and both.feed("cd") == (2, "bc")
