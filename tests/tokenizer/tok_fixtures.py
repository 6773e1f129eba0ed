"""A byte-level BPE tokenizer trained here (digits split one by one, as Qwen's and Llama 3's
pre-tokenizers split them) and saved by transformers, for the tokenizer tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import hf_folders
import pytest
from tokenizers import Tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|eot_id|>",
            "<|start_header_id|>", "<|end_header_id|>"]

CORPUS = [
    "The quick brown fox jumps over the lazy dog. 12 + 30 = 42, and 7 * 6 is 42 too.",
    "def add(a, b):\n    return a + b  # code, with indentation\n",
    '{"name": "calculator", "arguments": {"expression": "(3 + 4) * 5"}}',
    "<tool_call>\n{\"name\": \"search\"}\n</tool_call> then <tool_response>ok</tool_response>",
    "这是一个中文句子，用于测试分词器。我们需要多字节字符。",
    "Emoji: 🎉🚀👍🏽 and accents: café, naïve, Zürich. Привет мир!",
    "Answer: \\boxed{17}. Final answer: Yes. Score: 8/10.",
    "<think>\nLet me reason step by step.\n</think>\n\nThe answer is 5.",
]


def train_bpe(vocab_size: int = 600) -> Tokenizer:
    """The test suite's byte-level BPE (``hf_folders.train_bpe``) on this module's corpus, with
    ChatML and Llama 3 specials and the tool tags left as plain text."""
    return hf_folders.train_bpe(vocab_size, CORPUS * 20, tool_tags=False, specials=SPECIALS)


@pytest.fixture(scope="session")
def bpe() -> Tokenizer:
    return train_bpe()


Saver = Callable[..., Path]


@pytest.fixture
def save_hf(bpe: Tokenizer, tmp_path: Path) -> Saver:
    """save_hf(name, **PreTrainedTokenizerFast kwargs) -> a folder transformers wrote."""
    from transformers import PreTrainedTokenizerFast

    def save(name: str = "tok", **kwargs: Any) -> Path:
        kwargs.setdefault("eos_token", "<|im_end|>")
        fast = PreTrainedTokenizerFast(tokenizer_object=bpe, **kwargs)
        out = tmp_path / name
        fast.save_pretrained(out)
        return out

    return save
