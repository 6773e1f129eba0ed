"""YaRN rope scaling and the Mistral and OLMo-2 families, beyond the shared per-family decode
test (tests/engines/test_hf_models.py): YaRN's frequencies and attention factor for each of its
knobs, the trainer's forward (and OLMo-2's gradients) against transformers, past YaRN's original
context, configs pivotflow writes that transformers rebuilds, and the one-line errors (a Mistral
sliding window that would bind, a bad YaRN key)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_fixtures import MISTRAL, OLMO2, PROMPTS, SIZES, YARN, YARN_ROPE, save_folder

from pivotflow.engines.torch import config_from_hf, load_model_folder, save_checkpoint
from pivotflow.engines.torch.model import Decoder
from pivotflow.engines.torch.rope import rope_attention_factor, rope_inv_freq
from pivotflow.errors import ModelConfigError

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("rope", [
    YARN_ROPE,  # Qwen's recipe: factor and original length only
    {**YARN_ROPE, "factor": 8.0, "original_max_position_embeddings": 16, "beta_fast": 16,
     "beta_slow": 2, "truncate": False},  # gpt-oss writes truncate false
    {**YARN_ROPE, "attention_factor": 0.9},
    {**YARN_ROPE, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707},  # DeepSeek's pair
    {**YARN_ROPE, "factor": 2.0, "original_max_position_embeddings": 128, "rope_theta": 1e6},
], ids=["qwen", "betas-untruncated", "attention-factor", "mscale-pair", "wide"])  # fmt: skip
def test_yarn_frequencies_and_attention_factor_equal_transformers(rope: dict[str, Any]) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    theirs_config = transformers.Qwen3Config(**{**SIZES, "max_position_embeddings": 512},
                                             head_dim=32, rope_parameters=dict(rope))
    inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](theirs_config, "cpu")
    ours = config_from_hf(theirs_config.to_dict(), "config.json")
    assert ours.rope_type == "yarn"
    torch.testing.assert_close(rope_inv_freq(ours), inv_freq, atol=0, rtol=1e-6)
    assert rope_attention_factor(ours) == pytest.approx(factor, rel=1e-12)
    assert factor != 1.0


@pytest.mark.parametrize("case", [MISTRAL, YARN, OLMO2], ids=lambda c: c.name)
def test_the_trainers_forward_and_the_configs_pivotflow_writes_equal_transformers(
    tmp_path: Path, case: Any
) -> None:
    model = save_folder(case, tmp_path / "theirs")
    folder = load_model_folder(tmp_path / "theirs")
    ours = Decoder(folder.config)
    ours.load_state_dict(folder.tensors, strict=False)  # (a tied model's file has no lm_head)
    ours.eval()
    ids = torch.tensor([PROMPTS[2] * 10])  # 70 positions: past YaRN's original 32
    with torch.no_grad():
        reference = model(ids).logits
        torch.testing.assert_close(ours(ids), reference, atol=1e-5, rtol=0)
    save_checkpoint(tmp_path / "ours", folder.config, folder.tensors)
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    if case is MISTRAL:
        assert written["model_type"] == "mistral" and written["sliding_window"] is None
    elif case is OLMO2:
        assert written["architectures"] == ["Olmo2ForCausalLM"]
    else:
        assert written["rope_parameters"]["rope_type"] == "yarn"
        assert written["rope_parameters"]["original_max_position_embeddings"] == 32
    rebuilt = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours").eval()
    assert load_model_folder(tmp_path / "ours").config == folder.config
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(ids).logits, reference, atol=1e-5, rtol=0)


def test_olmo2_gradients_equal_transformers(tmp_path: Path) -> None:
    """Post-norm layers and whole-projection q/k norms in the trainer's backward pass too: every
    gradient (the norms' included) equals transformers' on a right-padded batch."""
    model = save_folder(OLMO2, tmp_path)
    folder = load_model_folder(tmp_path)
    ours = Decoder(folder.config)
    ours.load_state_dict(folder.tensors)
    width = max(map(len, PROMPTS))
    ids = torch.tensor([p + [0] * (width - len(p)) for p in PROMPTS])
    mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in PROMPTS])
    real = mask.bool()
    weights = torch.linspace(-1.0, 1.0, folder.config.vocab_size)
    (model(ids, attention_mask=mask).logits[real] * weights).sum().backward()
    (ours(ids, attention_mask=mask)[real] * weights).sum().backward()
    theirs = dict(model.named_parameters())
    names = [n for n, _ in ours.named_parameters()]
    assert "model.layers.0.post_feedforward_layernorm.weight" in names
    assert not any("input_layernorm" in n for n in names)
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs[name].grad, atol=1e-5, rtol=1e-4, msg=name)


def test_a_mistral_window_is_accepted_only_where_it_never_binds(tmp_path: Path) -> None:
    save_folder(MISTRAL, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["max_position_embeddings"] == 128
    for window in (None, 128, 4096):
        assert config_from_hf({**raw, "sliding_window": window}, "c.json").architecture == "mistral"
    # Mistral 7B v0.1: a window of 4096 over 32768 positions; an absent key is transformers' 4096
    v01 = {k: v for k, v in raw.items() if k != "sliding_window"}
    for bad, shown in (({**raw, "sliding_window": 64}, "64"),
                       ({**v01, "max_position_embeddings": 32768}, "4096")):  # fmt: skip
        with pytest.raises(ModelConfigError, match=(
                rf"^c\.json: sliding_window={shown} is not supported by the embedded engine "
                r"\(null, or at least max_position_embeddings=\d+: no sliding-window attention\)$")):
            config_from_hf(bad, "c.json")


@pytest.mark.parametrize(("rope", "message"), [
    ({"rope_type": "yarn", "original_max_position_embeddings": 32},
     r"rope_parameters\.factor is missing \(rope_type 'yarn'\)"),
    ({**YARN_ROPE, "beta_fast": 1, "beta_slow": 32},
     r"rope_beta_fast 1\.0 must exceed rope_beta_slow 32\.0"),
    ({**YARN_ROPE, "truncate": "yes"}, r"rope_parameters\.truncate='yes' is not true or false"),
    ({**YARN_ROPE, "mscale": "big"}, r"rope_parameters\.mscale='big' is not a number"),
    ({**YARN_ROPE, "attention_factor": -1.0}, r"rope_attention_factor must be >= 0, got -1\.0"),
])  # fmt: skip
def test_a_bad_yarn_key_is_a_one_line_error(rope: dict[str, Any], message: str) -> None:
    raw = {"model_type": "qwen3", **SIZES, "head_dim": 32, "rope_parameters": rope}
    with pytest.raises(ModelConfigError, match=r"^c\.json: " + message) as exc:
        config_from_hf(raw, "c.json")
    assert "\n" not in str(exc.value)


def test_a_mistral_config_with_attention_biases_is_refused_on_the_way_out() -> None:
    raw = {"model_type": "mistral", **SIZES, "head_dim": 32, "sliding_window": None,
           "attention_bias": True}  # (transformers' Mistral has no such key: ignored on read)
    cfg = config_from_hf(raw, "c.json")
    assert not cfg.attention_bias
    from msgspec.structs import replace

    from pivotflow.engines.torch.hf_config import config_to_hf

    with pytest.raises(ModelConfigError, match="a mistral checkpoint has no attention biases"):
        config_to_hf(replace(cfg, attention_bias=True), torch.float32)
