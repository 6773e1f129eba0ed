"""Hugging Face model folders for tests: a byte-level BPE tokenizer trained here on the task
kit's kind of text, with a ChatML chat template, next to small random-weight decoders.

Two ways to write the tokenizer, both loading with ``AutoTokenizer``: ``save_tokenizer`` goes
through pivotflow's own ``HFTokenizer`` (no transformers import: the fast path for fixtures),
``save_tokenizer_hf`` through transformers' ``PreTrainedTokenizerFast.save_pretrained`` (what a
user's folder holds).
"""

from __future__ import annotations

import random
from pathlib import Path

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

EOS, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TOOL_TAGS = ("<tool_call>", "</tool_call>")

# ChatML as Qwen2.5 writes it (no default system message, so the rendering is short)
CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def corpus(n: int = 400, seed: int = 0) -> list[str]:
    """Sums, verdicts, chat turns and tool calls: the text the random models are prompted with."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        lines += [f"{a}+{b}={a + b}", f"{a}+{b}={a + b}?{a + b}:Yes",
                  f"What is {a} plus {b}? The answer is {a + b}.",
                  f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": '
                  f'"{a}+{b}"}}}}\n</tool_call>\n<tool_response>\n{a + b}\n</tool_response>']
    return lines


def train_bpe(vocab_size: int = 320, texts: list[str] | None = None,
              tool_tags: bool = True,
              specials: list[str] | None = None) -> tokenizers.Tokenizer:
    """A byte-level BPE with every digit its own pre-token (Qwen's and Llama 3's rule), the
    ChatML specials first (eos ``<|endoftext|>`` is id 0) and, with ``tool_tags``, the tool tags
    as plain added tokens (decoded text keeps them, as in Qwen2.5; without, a tag is several
    byte-level tokens, as in Llama 3). ``specials`` replaces the ChatML specials (eos first)."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size,
                                  special_tokens=specials or [EOS, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts or corpus(), trainer)
    if tool_tags:
        tok.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False)
                        for t in TOOL_TAGS])
    return tok


def save_tokenizer(tok: tokenizers.Tokenizer, folder: Path,
                   chat_template: str | None = CHATML) -> int:
    """Write ``tok`` as a tokenizer folder through pivotflow's HFTokenizer; returns its size."""
    from pivotflow.tokenizer import HFTokenizer

    hf = HFTokenizer.from_parts(tok, eos_token=EOS, pad_token=EOS, chat_template=chat_template,
                                name_or_path=str(folder))
    hf.save(folder)
    return hf.vocab_size


def save_tokenizer_hf(tok: tokenizers.Tokenizer, folder: Path,
                      chat_template: str | None = CHATML) -> int:
    """Write ``tok`` as transformers does (``save_pretrained``); returns ``len(tokenizer)``."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS,
                                   additional_special_tokens=[IM_START, IM_END])
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(folder)
    return len(fast)
