"""A model whose embedding is padded past its tokenizer (as Qwen pads to a multiple of 64) must
never sample an id without text: TorchEngine's vocab_limit keeps those ids out of the draw.

The model is a real Qwen2 that transformers builds and saves, next to pivotflow's own trained
BPE tokenizer; its padded rows of lm_head are made the most likely tokens, so that without the
limit greedy decoding picks them (and decoding the response fails)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from pivotflow.engines.base import GenerationRequest, SamplingParams
from pivotflow.engines.torch import TorchEngine, load_model_folder
from pivotflow.errors import EngineError, TokenizerError

PROMPTS = ["What is 12 plus 30?", "7+8=", "The answer is"]
NEW = 12


@pytest.fixture(scope="module")
def padded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Path]:
    """(transformers model, tokenizer, folder) with the embedding 64 rows past the tokenizer."""
    transformers = pytest.importorskip("transformers")
    from pivotflow.tasks.bpe import build_tokenizer

    tok = build_tokenizer()
    vocab = -(-tok.vocab_size // 64) * 64 + 64
    config = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
        # Each padded row points where the strongest real rows point, twice as far: whatever
        # the hidden state, some padded id outscores nearly every real one.
        head = model.lm_head.weight
        strongest = head[: tok.vocab_size].norm(dim=1).topk(vocab - tok.vocab_size).indices
        head[tok.vocab_size :] = 2.0 * head[strongest]
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    folder = tmp_path_factory.mktemp("padded-qwen2")
    model.save_pretrained(folder)
    return model, tok, folder


def _engine(folder: Path, **kw: Any) -> TorchEngine:
    got = load_model_folder(folder)
    engine = TorchEngine(got.config, max_batch=4, max_seq_len=64, **kw)
    engine.load_weights(got.tensors, 0)
    return engine


def _generate(engine: TorchEngine, prompts: list[list[int]], temperature: float) -> list[Any]:
    params = SamplingParams(temperature=temperature, max_tokens=NEW, seed=3)
    reqs = [GenerationRequest(f"r{i}", p, params) for i, p in enumerate(prompts)]
    return engine.generate(reqs)


@pytest.mark.timeout(120)
def test_without_a_limit_padded_ids_are_sampled_and_do_not_decode(padded) -> None:  # type: ignore[no-untyped-def]
    _, tok, folder = padded
    prompts = [tok.encode(p) for p in PROMPTS]
    outs = _generate(_engine(folder), prompts, 0.0)
    ids = [t for o in outs for t in o.token_ids]
    assert max(ids) >= tok.vocab_size  # the fixture does what it claims
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        for o in outs:
            tok.decode(o.token_ids)


@pytest.mark.timeout(120)
def test_vocab_limit_greedy_equals_transformers_with_padded_ids_suppressed(padded) -> None:  # type: ignore[no-untyped-def]
    model, tok, folder = padded
    prompts = [tok.encode(p) for p in PROMPTS]
    outs = _generate(_engine(folder, vocab_limit=tok.vocab_size), prompts, 0.0)
    banned = list(range(tok.vocab_size, model.config.vocab_size))
    for prompt, out in zip(prompts, outs, strict=True):
        assert max(out.token_ids) < tok.vocab_size
        assert isinstance(tok.decode(out.token_ids), str)
        ids = torch.tensor([prompt])
        with torch.no_grad():
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=NEW, suppress_tokens=banned)  # fmt: skip
        assert out.token_ids == ref[0, len(prompt) :].tolist()
        # Logprobs stay those of the whole vocabulary, as the trainer's forward pass gives them.
        full = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logits = model(full).logits[0, len(prompt) - 1 : -1].float()
        want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out.token_ids)[:, None])
        torch.testing.assert_close(torch.tensor(out.logprobs), want[:, 0], atol=1e-4, rtol=1e-4)


@pytest.mark.timeout(120)
def test_vocab_limit_holds_for_sampling_and_nucleus(padded) -> None:  # type: ignore[no-untyped-def]
    _, tok, folder = padded
    engine = _engine(folder, vocab_limit=tok.vocab_size)
    prompts = [tok.encode(p) for p in PROMPTS]
    for temperature, top_p in ((1.0, 1.0), (2.0, 1.0), (1.0, 0.9)):
        for seed in range(4):
            params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=NEW,
                                    seed=seed)  # fmt: skip
            reqs = [GenerationRequest(f"s{i}", p, params) for i, p in enumerate(prompts)]
            for out in engine.generate(reqs):
                assert len(out.token_ids) == NEW and max(out.token_ids) < tok.vocab_size
                tok.decode(out.token_ids)


def test_vocab_limit_out_of_range_is_a_one_line_error(padded) -> None:  # type: ignore[no-untyped-def]
    _, _, folder = padded
    cfg = load_model_folder(folder).config
    for bad in (0, cfg.vocab_size + 1):
        with pytest.raises(EngineError, match=rf"^vocab_limit {bad} must be in 1\.\.vocab_size "):
            TorchEngine(cfg, max_batch=1, max_seq_len=16, vocab_limit=bad)
