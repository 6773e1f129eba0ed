"""Registers the engine test fixtures (defined in engine_fixtures.py, which tests also import)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from engine_fixtures import make, weights

__all__ = ["make", "one_thread", "weights"]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread; on a busy 2-core host a second OpenMP thread
    waiting at every op's barrier makes each step tens of times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
