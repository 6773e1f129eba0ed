"""Tokenizers behind one interface (``base.Tokenizer``); importing this package loads no torch.

``load_tokenizer(folder)`` reads a Hugging Face tokenizer folder (``HFTokenizer``) or an old
char one (``CharTokenizer``); ``HFTokenizer.from_parts`` builds one in code.
"""

from pivotflow.tokenizer.base import IncrementalDetokenizer, Message, Tokenizer
from pivotflow.tokenizer.batch import pad_batch
from pivotflow.tokenizer.char import TASK_ALPHABET, CharTokenizer, default_tokenizer
from pivotflow.tokenizer.hf import HFTokenizer
from pivotflow.tokenizer.incremental import StopScanner, WindowDetokenizer
from pivotflow.tokenizer.load import load_tokenizer

__all__ = [
    "TASK_ALPHABET",
    "CharTokenizer",
    "HFTokenizer",
    "IncrementalDetokenizer",
    "Message",
    "StopScanner",
    "Tokenizer",
    "WindowDetokenizer",
    "default_tokenizer",
    "load_tokenizer",
    "pad_batch",
]
