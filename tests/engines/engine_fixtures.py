"""Helpers and fixtures for the engine tests: a tiny random-weight decoder on the task vocabulary."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from pivotflow.engines.base import GenerationRequest, SamplingParams
from pivotflow.engines.torch import Decoder, ModelConfig, TorchEngine
from pivotflow.tokenizer import default_tokenizer

TOKENIZER = default_tokenizer()
CONFIG = ModelConfig(
    vocab_size=TOKENIZER.vocab_size,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def tiny_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights; larger than the default init so distributions are not near uniform."""
    torch.manual_seed(seed)
    model = Decoder(CONFIG)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="session")
def weights() -> dict[str, torch.Tensor]:
    return tiny_weights()


@pytest.fixture
def make(weights: dict[str, torch.Tensor]) -> Callable[..., TorchEngine]:
    """Build a TorchEngine with the tiny weights loaded (version 0 unless told)."""

    def build(version: int = 0, **kw: object) -> TorchEngine:
        kw.setdefault("detokenize", TOKENIZER.decode)
        engine = TorchEngine(CONFIG, **kw)  # type: ignore[arg-type]
        engine.load_weights(weights, version)
        return engine

    return build


def req(
    rid: str,
    text: str = "ab",
    *,
    temperature: float = 0.0,
    max_tokens: int = 12,
    seed: int | None = 0,
    top_p: float = 1.0,
    stop_token_ids: tuple[int, ...] = (),
    stop_strings: tuple[str, ...] = (),
) -> GenerationRequest:
    """A request for the prompt ``text`` (bos + chars)."""
    params = SamplingParams(
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        seed=seed,
        stop_token_ids=stop_token_ids,
        stop_strings=stop_strings,
    )
    return GenerationRequest(rid, TOKENIZER.encode(text, add_special_tokens=True), params)


def mixed_requests() -> list[GenerationRequest]:
    """Greedy and sampled (with and without top-p) requests of different lengths."""
    texts = ["ab", "hello", "x", "12+34=", "the cat", "q", "zz top", "RL!", "0", "abc def"]
    out = []
    for i, text in enumerate(texts):
        out.append(
            req(
                f"r{i}",
                text,
                temperature=[0.0, 1.0, 0.7][i % 3],
                top_p=0.9 if i % 4 == 1 else 1.0,
                max_tokens=6 + 3 * i,
                seed=100 + i,
            )
        )
    return out
