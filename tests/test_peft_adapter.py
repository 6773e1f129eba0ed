"""Starting from an SFT adapter (``g.model(..., adapter=DIR)``): a PEFT LoRA adapter saved by
``peft`` on a transformers Qwen2 is merged into the weights the run publishes as version 0,
exactly as PEFT's own ``merge_and_unload`` merges it; and an adapter folder that is not one, or
not for this model, is one line naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_folders import save_tokenizer_hf, train_bpe
from test_byo_model import save_qwen2

from pivotflow.errors import ModelConfigError
from pivotflow.graph import Graph
from pivotflow.params.shm_store import ShmParamStore
from pivotflow.run_models import prepare_models
from pivotflow.worker.lora import merge_peft_adapter

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def sft(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, torch.Tensor]]:
    """A Qwen2 folder, a PEFT adapter trained-looking (B not zero) on q/v/down projections,
    and what PEFT merges the two to."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("sft")
    base_dir, adapter_dir = root / "base", root / "adapter"
    save_qwen2(base_dir, save_tokenizer_hf(train_bpe(), base_dir))
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
        init_lora_weights=False))  # (random B: an update that says something)
    peft_model.save_pretrained(adapter_dir)
    merged = peft_model.merge_and_unload().state_dict()
    return base_dir, adapter_dir, {k: v.detach().clone() for k, v in merged.items()}


def graph_of(base: Path, adapter: Path | str) -> Graph:
    from pivotflow.rl.group_fns import grpo_advantage

    g = Graph("sft_start")
    g.model("policy", source=str(base), adapter=str(adapter))
    g.pool("rollout", workers=1)
    g.pool("trainer", workers=1)
    g.chain(g.source("prompts", task="arithmetic"),
            g.generate("rollout", model="policy", pool="rollout"),
            g.map("reward", lambda **_: 1.0, writes=["reward"]),
            g.group("advantage", grpo_advantage, writes=["advantage"]),
            g.train("train", model="policy", pool="trainer"))
    return g


def test_the_run_starts_from_what_peft_merges(tmp_path: Path, sft: tuple) -> None:
    base_dir, adapter_dir, merged = sft
    store = ShmParamStore(tmp_path / "store")
    prepare_models(graph_of(base_dir, adapter_dir), store, seed=0, console=False)
    _, _, published = store.load("policy", 0)
    moved = 0
    for k, w in published.items():
        torch.testing.assert_close(w, merged[k], rtol=0, atol=1e-6, msg=k)
        moved += k.endswith(("q_proj.weight", "v_proj.weight", "down_proj.weight"))
    assert moved == 3 * 2  # three adapted layers in each of the two decoder layers
    from safetensors.torch import load_file

    before = load_file(str(base_dir / "model.safetensors"))
    assert not torch.equal(published["model.layers.0.self_attn.q_proj.weight"],
                           before["model.layers.0.self_attn.q_proj.weight"])


def test_a_phi3_adapter_on_the_fused_qkv_merges_as_peft_merges_it(tmp_path: Path) -> None:
    """Phi-3's adapters target the file's fused ``qkv_proj`` and ``gate_up_proj``: merged in
    that layout, then held split as the run holds every model; PEFT's rank_pattern and
    alpha_pattern give layers their own scale, as PEFT merges them."""
    from peft import LoraConfig, get_peft_model
    from transformers import Phi3Config, Phi3ForCausalLM

    from pivotflow.params.hf_layout import disk_layout

    base_dir, adapter_dir = tmp_path / "base", tmp_path / "adapter"
    base_dir.mkdir()
    vocab = save_tokenizer_hf(train_bpe(), base_dir)
    torch.manual_seed(1)
    model = Phi3ForCausalLM(Phi3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
        pad_token_id=0, eos_token_id=0, bos_token_id=1))
    model.save_pretrained(base_dir)
    peft_model = get_peft_model(model, LoraConfig(  # (per-layer ranks and alphas too)
        r=4, lora_alpha=8, target_modules=["qkv_proj", "gate_up_proj", "o_proj"],
        rank_pattern={"qkv_proj": 8}, alpha_pattern={"gate_up_proj": 2}, init_lora_weights=False))
    peft_model.save_pretrained(adapter_dir)
    merged = {k: v.detach().clone() for k, v in peft_model.merge_and_unload().state_dict().items()}
    store = ShmParamStore(tmp_path / "store")
    prepare_models(graph_of(base_dir, adapter_dir), store, seed=0, console=False)
    _, config, published = store.load("policy", 0)
    assert "model.layers.0.self_attn.k_proj.weight" in published
    fused = disk_layout(config, published)
    assert fused.keys() == merged.keys()
    for k, w in fused.items():
        torch.testing.assert_close(w, merged[k], rtol=0, atol=1e-6, msg=k)
    from safetensors.torch import load_file

    before = load_file(str(base_dir / "model.safetensors"))
    for name in ("model.layers.1.mlp.gate_up_proj.weight", "model.layers.0.self_attn.qkv_proj.weight"):
        assert not torch.equal(fused[name], before[name]), name


@pytest.mark.parametrize(("change", "message"), [
    ("missing", r"adapter_config\.json: no such file"),
    ("prefix", r"peft_type 'PREFIX_TUNING'; only LORA adapters merge"),
    ("dora", r"use_dora is true; not supported"),
    ("other_model", r"adapter_model\.safetensors: .*lora_A\.weight does not fit the model"),
])
def test_a_bad_adapter_folder_is_one_line(tmp_path: Path, sft: tuple, change: str,
                                          message: str) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    base_dir, adapter_dir, _ = sft
    bad = tmp_path / "adapter"
    shutil.copytree(adapter_dir, bad)
    config = json.loads((bad / "adapter_config.json").read_text())
    if change == "missing":
        (bad / "adapter_config.json").unlink()
    elif change in ("prefix", "dora"):
        config.update({"peft_type": "PREFIX_TUNING"} if change == "prefix" else {"use_dora": True})
        (bad / "adapter_config.json").write_text(json.dumps(config))
    else:  # an adapter of a wider model: its A reads 128 inputs where this model has 64
        weights = load_file(str(bad / "adapter_model.safetensors"))
        weights = {k: torch.zeros(v.shape[0], 128) if ".lora_A." in k else v
                   for k, v in weights.items()}
        save_file(weights, str(bad / "adapter_model.safetensors"))
    with pytest.raises(ModelConfigError, match=r"^model 'policy' at .*: adapter: .*" + message) \
            as err:
        prepare_models(graph_of(base_dir, bad), ShmParamStore(tmp_path / "store"), seed=0,
                       console=False)
    assert "\n" not in str(err.value)


def test_merging_an_adapter_into_no_pair_is_an_error(tmp_path: Path, sft: tuple) -> None:
    from safetensors.torch import save_file

    _, adapter_dir, _ = sft
    (tmp_path / "adapter_config.json").write_text((adapter_dir / "adapter_config.json").read_text())
    save_file({"unrelated": torch.zeros(1)}, str(tmp_path / "adapter_model.safetensors"))
    with pytest.raises(ModelConfigError, match="no lora_A/lora_B pair: nothing to merge"):
        merge_peft_adapter({"w": torch.zeros(1)}, tmp_path)
