"""The slot KV cache and the packed serving path: same logits as Decoder.forward, capacity
changes that keep every running sequence intact, weight loads seen through the packed views."""

from __future__ import annotations

import pytest
import torch
from engine_fixtures import CONFIG, mixed_requests, req, tiny_weights

from pivotflow.engines.torch import Decoder, ModelConfig
from pivotflow.engines.torch.kv_cache import PackedDecoder
from pivotflow.engines.torch.slot_cache import SlotKVCache
from pivotflow.engines.torch.weights import build_model

LLAMA = ModelConfig(
    vocab_size=50,
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=40,
    attention_bias=False,
    tie_word_embeddings=False,
    architecture="llama",
)
# Qwen3 with every option the packed path must honour: q/k norms, biases on all four attention
# projections, heads * head_dim (4 * 16) unlike hidden_size 48, and llama3 rope scaling.
QWEN3 = ModelConfig(
    vocab_size=50,
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=40,
    attention_bias=True,
    tie_word_embeddings=False,
    rope_type="llama3",
    rope_factor=4.0,
    rope_original_max_position_embeddings=8,
    architecture="qwen3",
)


def _served(
    cfg: ModelConfig, prompts: list[list[int]], steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [B, 1 + steps, vocab] of a prefill and greedy decode steps through the cache, and
    those a full forward pass over the same tokens gives at the same positions."""
    torch.manual_seed(0)
    # Norm weights and biases off their init (ones, zeros), so one left out would show.
    weights = {
        k: v.normal_(0.0, 0.2) if v.dim() == 2 else v.add_(0.2 * torch.randn_like(v))
        for k, v in Decoder(cfg).state_dict().items()
    }
    reference = Decoder(cfg)
    reference.load_state_dict(weights)
    with torch.inference_mode():
        model = build_model(cfg, weights, "cpu", torch.float32)
        packed = PackedDecoder(model, 40)
        cache = SlotKVCache(cfg, len(prompts), 40, "cpu", torch.float32)
        lengths = [len(p) for p in prompts]
        ids = torch.tensor([p + [0] * (max(lengths) - len(p)) for p in prompts])
        cache.begin_prefill(0, lengths)
        served = [packed.prefill(ids, torch.tensor(lengths) - 1, cache)]
        seqs = [list(p) for p in prompts]
        for _ in range(steps):
            tokens = served[-1].argmax(-1)
            for seq, token in zip(seqs, tokens.tolist(), strict=True):
                seq.append(token)
            served.append(packed.decode(tokens, cache.begin_decode(len(seqs)), cache))
        full = []
        for seq in seqs:
            logits = reference(torch.tensor([seq]))[0]
            full.append(logits[len(seq) - steps - 1 :])
    return torch.stack(served, 1), torch.stack(full)


@pytest.mark.parametrize(
    "cfg", [CONFIG, LLAMA, QWEN3], ids=["qwen2-tied-bias", "llama-untied", "qwen3-wide-heads"]
)
def test_packed_path_matches_a_full_forward_pass(cfg: ModelConfig) -> None:
    prompts = [[1, 5, 9, 3], [1, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]]
    served, full = _served(cfg, prompts, steps=20)  # crosses two capacity chunks
    assert torch.allclose(served, full, atol=1e-5)


def test_capacity_grows_and_shrinks_without_losing_a_sequence(make, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    requests = mixed_requests()
    expected = [make(max_batch=1).generate([r])[0] for r in requests]
    monkeypatch.setattr(SlotKVCache, "CHUNK", 4)  # a re-layout every few steps, both ways
    engine = make(max_batch=4)
    seen: list[int] = []
    fit = SlotKVCache._fit

    def spy(self: SlotKVCache, *args: object, **kw: object) -> None:
        fit(self, *args, **kw)  # type: ignore[arg-type]
        seen.append(self.capacity)

    monkeypatch.setattr(SlotKVCache, "_fit", spy)
    for want, got in zip(expected, engine.generate(requests), strict=True):
        assert got.token_ids == want.token_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
    changes = [b - a for a, b in zip(seen[:-1], seen[1:], strict=True)]
    assert max(changes) > 0 and min(changes) < 0  # grew and shrank


def test_decode_past_max_len_is_refused() -> None:
    cache = SlotKVCache(CONFIG, 2, 8, "cpu", torch.float32)
    cache.begin_prefill(0, [8, 3])
    with pytest.raises(Exception, match="cache length 8"):
        cache.begin_decode(2)


def test_weight_loads_reach_the_packed_path(make) -> None:  # type: ignore[no-untyped-def]
    engine = make()
    request = req("r", "hello", max_tokens=10)
    before = engine.generate([request])[0]
    engine.load_weights(tiny_weights(seed=1), version=1)
    fresh = make()
    fresh.load_weights(tiny_weights(seed=1), version=1)
    after, expected = engine.generate([request])[0], fresh.generate([request])[0]
    assert after.token_ids == expected.token_ids and after.logprobs == expected.logprobs
    assert after.token_ids != before.token_ids or after.logprobs != before.logprobs
