"""Old home of the char tokenizer; it lives in ``pivotflow.tokenizer`` now. Kept so importers
migrate one at a time (the coordinator removes this shim when none is left)."""

from pivotflow.tokenizer.batch import pad_batch
from pivotflow.tokenizer.char import BOS, EOS, PAD, TASK_ALPHABET, CharTokenizer, default_tokenizer

__all__ = ["BOS", "EOS", "PAD", "TASK_ALPHABET", "CharTokenizer", "default_tokenizer", "pad_batch"]
