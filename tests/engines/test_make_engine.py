"""make_engine: the torch default, the optional backends, unknown kinds."""

from __future__ import annotations

import importlib.util

import pytest
from engine_fixtures import CONFIG

from pivotflow.engines import make_engine
from pivotflow.engines.torch import TorchEngine
from pivotflow.errors import EngineError


def test_torch_kind_builds_the_embedded_engine() -> None:
    engine = make_engine("torch", CONFIG, max_batch=3)
    assert isinstance(engine, TorchEngine) and engine.max_batch == 3


def test_unknown_kind_lists_the_valid_ones() -> None:
    with pytest.raises(EngineError, match="'tgi'.*torch, vllm, sglang"):
        make_engine("tgi", CONFIG)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_missing_backend_says_how_to_install_it(kind: str) -> None:
    if importlib.util.find_spec(kind) is not None:
        pytest.skip(f"{kind} is installed here")
    with pytest.raises(
        EngineError, match=rf"{kind} is not installed; pip install 'pivotflow\[{kind}\]'"
    ):
        make_engine(kind, CONFIG, model_path="/nonexistent")
