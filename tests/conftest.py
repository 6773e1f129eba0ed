"""Shared fixtures: small random-weight checkpoints and graph files that use them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from script_modules import load_script

from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.engines.torch.weights import save_checkpoint

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def random_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A policy and a judge with random weights (fast to load; they do not learn the task), each
    an ordinary Hugging Face folder: config.json, model.safetensors and a byte-level BPE
    tokenizer trained here (with a ChatML template), whose size is the model's vocab_size (a
    random model samples every id of its embedding, so none may lack a token)."""
    from hf_folders import save_tokenizer, train_bpe

    root = tmp_path_factory.mktemp("models")
    bpe = train_bpe()
    torch.manual_seed(0)
    out = {}
    for name in ("policy", "judge"):
        vocab = save_tokenizer(bpe, root / name)
        cfg = ModelConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                          max_position_embeddings=64)
        save_checkpoint(root / name, cfg, Decoder(cfg).state_dict())
        out[name] = root / name
    return out


@pytest.fixture
def random_genrm_graph(tmp_path: Path, random_models: dict[str, Path]) -> Path:
    """graphs/grpo_genrm.py with the random-weight models instead of the built-in ones."""
    text = (ROOT / "graphs" / "grpo_genrm.py").read_text()
    text = text.replace("builtin:policy", str(random_models["policy"]))
    text = text.replace("builtin:judge", str(random_models["judge"]))
    path = tmp_path / "grpo_genrm_random.py"
    path.write_text(text)
    return path


def load_bench_script(name: str) -> ModuleType:
    """``bench/<name>.py`` as a module (bench/ holds scripts, not a package)."""
    return load_script(ROOT / "bench" / f"{name}.py")


@pytest.fixture
def bench_script() -> Callable[[str], ModuleType]:
    return load_bench_script


@pytest.fixture
def script() -> Callable[[Path], ModuleType]:
    return load_script
