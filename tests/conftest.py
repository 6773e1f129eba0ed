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


# The core suite runs in two processes, a whole test file at a time (`-n 2 --dist loadfile`).
# xdist hands files out by their number of tests, most first, so the few-test files that start
# whole runs (a fake Ray cluster, learning curves) went last, and one process ran them alone
# for minutes at the end. These go first instead, longest first (seconds measured on 12-06 in
# two processes on the 2-core host); a file not named keeps its place after them.
SLOW_FILES_FIRST = (  # (12-06 evening, workers forked: seconds of the file's tests)
    "ray/test_ray_runs.py",  # 170
    "test_learning.py",  # 183
    "tasks/test_cache.py",  # 91
    "test_run_faults.py",  # 83
    "multihost/test_two_hosts.py",  # 68
    "test_evaluation.py",  # 46
    "worker/test_sharded_adam.py",  # 34
    "test_lora_run.py",  # 30
    "test_user_code_faults.py",  # 29
)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # (xdist's; absent without it)
        config.option.loadscopereorder = False  # keep the order below


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.path.as_posix()
        return next((i for i, name in enumerate(SLOW_FILES_FIRST)
                     if path.endswith(f"tests/{name}")), len(SLOW_FILES_FIRST))

    items.sort(key=rank)  # (stable: each file's tests, and the other files, keep their order)
