"""Tokenizers behind one interface (``base.Tokenizer``); importing this package loads no torch."""
