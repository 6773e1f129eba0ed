"""SFT encoding, config checks, and greedy decoding of mixed-length batches."""

from __future__ import annotations

import pytest
import torch

from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.errors import ConfigError
from pivotflow.tasks.sft import SFTConfig, encode_pairs, greedy_complete, train_sft
from pivotflow.tokenizer.base import Tokenizer


def _tiny(vocab: int, seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    return Decoder(
        ModelConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    ).eval()


def test_mask_covers_completion_and_eos_only(bpe: Tokenizer) -> None:
    tok = bpe
    assert tok.bos_id is None and tok.pad_id == tok.eos_id  # as Qwen's: no BOS, pad is EOS
    ids, mask = encode_pairs(tok, [("1+2=", "3"), ("10+20=", "30")])
    # one token per digit and operator: "1+2=" is 4 tokens, "10+20=" 6
    assert ids.shape == (2, 9) and mask.shape == (2, 8)
    assert ids[0].tolist() == [*tok.encode("1+2=3"), tok.eos_id] + [tok.pad_id] * 3
    assert ids[1].tolist() == [*tok.encode("10+20=30"), tok.eos_id]
    # Targets are ids[:, 1:]: row 0 predicts "3" and EOS, row 1 "3", "0" and EOS; the padding
    # (the same id as EOS) is never a target.
    assert mask[0].nonzero().flatten().tolist() == [3, 4]
    assert mask[1].nonzero().flatten().tolist() == [5, 6, 7]


@pytest.mark.parametrize(
    ("field", "value"), [("schedule", "linear"), ("steps", 0), ("batch_size", 0), ("lr", 0.0)]
)
def test_bad_config_is_a_config_error(field: str, value: object, bpe: Tokenizer) -> None:
    with pytest.raises(ConfigError, match=field):
        SFTConfig(**{field: value}).validate()  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="at least one"):
        train_sft(_tiny(bpe.vocab_size), bpe, [], SFTConfig(), progress=False)


def test_an_empty_prompt_is_named(bpe: Tokenizer) -> None:
    # without a BOS an empty prompt has no position to predict the completion from
    with pytest.raises(ConfigError, match="encodes to no tokens"):
        encode_pairs(bpe, [("", "3")])
    with pytest.raises(ConfigError, match="encodes to no tokens"):
        greedy_complete(_tiny(bpe.vocab_size), bpe, ["1+2=", ""], max_new_tokens=2)


def test_batched_greedy_equals_one_at_a_time(bpe: Tokenizer) -> None:
    model, tok = _tiny(bpe.vocab_size), bpe
    prompts = ["1+2=", "47+38=84?", "<tool_call>", "999*999=", "5"]
    batched = greedy_complete(model, tok, prompts, max_new_tokens=6, batch_size=3)
    single = [greedy_complete(model, tok, [p], max_new_tokens=6)[0] for p in prompts]
    assert batched == single


def test_early_stop_callback_ends_training(bpe: Tokenizer) -> None:
    tok = bpe
    seen: list[int] = []

    def stop(step: int) -> bool:
        seen.append(step)
        return step >= 20

    cfg = SFTConfig(steps=100, batch_size=4, lr=1e-3, eval_every=10, threads=1)
    res = train_sft(_tiny(tok.vocab_size), tok, [("1+1=", "2")], cfg, should_stop=stop,
                    progress=False)
    assert seen == [10, 20] and res.steps == 20 and res.stopped_early
