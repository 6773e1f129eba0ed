"""Fixtures of the tokenizer tests (the helpers live in tok_fixtures.py: a module named
conftest would clash with other test folders' when pytest collects several)."""

from tok_fixtures import bpe, save_hf

__all__ = ["bpe", "save_hf"]
