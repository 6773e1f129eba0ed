"""The built-in models' tokenizer, trained once per session (a few seconds)."""

from __future__ import annotations

import pytest

from pivotflow.tasks.bpe import build_tokenizer
from pivotflow.tokenizer.base import Tokenizer


@pytest.fixture(scope="session")
def bpe() -> Tokenizer:
    return build_tokenizer(0)
