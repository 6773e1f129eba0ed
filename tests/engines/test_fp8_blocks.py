"""Block-wise FP8 folders (DeepSeek-V3/R1's, Kimi K2's, the Qwen3 -FP8 models' format) read as
bfloat16: on a tiny DeepSeek-V3 quantized here as those checkpoints are (E4M3 codes, one float32
scale per block), the weights pivotflow holds are those transformers' own dequantizer gives,
blocks cut short at a ragged edge are read as DeepSeek's and vLLM's kernels read them, and what
cannot be is a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_fixtures import DEEPSEEK_V3, save_folder

from pivotflow.engines.torch.weights import load_model_folder, save_checkpoint
from pivotflow.errors import ModelConfigError

E4M3_MAX = 448.0


def _quantize(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 codes, float32 scales [ceil(rows / bm), ceil(cols / bn)]) of ``w``, each block's
    largest value mapped to E4M3's largest (as DeepSeek's act/weight quantizer does)."""
    rows, cols = w.shape
    grid = (-(-rows // block[0]), -(-cols // block[1]))
    padded = torch.zeros(grid[0] * block[0], grid[1] * block[1])
    padded[:rows, :cols] = w.float()
    amax = padded.view(grid[0], block[0], grid[1], block[1]).abs().amax((1, 3))
    scales = amax.clamp(min=1e-12) / E4M3_MAX
    per_value = scales.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
    return (w.float() / per_value).to(torch.float8_e4m3fn), scales


def _fp8_folder(src: Path, dst: Path, block: tuple[int, int]) -> dict[str, torch.Tensor]:
    """``src``'s folder with every linear weight but the router's and the head's in FP8 (as
    DeepSeek-V3's files: embeddings, norms, routers and lm_head stay); returns its tensors."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(src / "model.safetensors"))
    out: dict[str, torch.Tensor] = {}
    for name, w in tensors.items():
        if w.dim() == 2 and "layers." in name and not name.endswith("mlp.gate.weight"):
            out[name], out[name.removesuffix(".weight") + ".weight_scale_inv"] = _quantize(
                w, block)
        else:
            out[name] = w
    dst.mkdir()
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                     "quant_method": "fp8", "weight_block_size": list(block)}
    (dst / "config.json").write_text(json.dumps(config))
    return out


def test_an_fp8_folder_holds_what_transformers_dequantizes(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    save_folder(DEEPSEEK_V3, tmp_path / "bf16")
    quantized = _fp8_folder(tmp_path / "bf16", tmp_path / "fp8", (16, 16))  # (every width: 16s)
    assert sum(t.dtype == torch.float8_e4m3fn for t in quantized.values()) > 20
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "fp8", dtype=torch.bfloat16,
        quantization_config=transformers.FineGrainedFP8Config(dequantize=True)).state_dict()
    ours = load_model_folder(tmp_path / "fp8")
    assert "quantization_config" not in ours.hf_config and ours.hf_config["dtype"] == "bfloat16"
    attention = [n for n, t in ours.tensors.items() if ".self_attn." in n and t.dim() == 2]
    assert len(attention) == 3 * 5  # q_a, q_b, kv_a, kv_b, o of 3 layers: each dequantized
    for name in attention + ["model.layers.0.mlp.down_proj.weight"]:
        assert ours.tensors[name].dtype == torch.bfloat16
        assert torch.equal(ours.tensors[name], theirs[name]), name
    # `pivotflow model` says so (a tokenizer beside it, as a run needs one)
    from hf_folders import save_tokenizer_hf, train_bpe

    from pivotflow.model_info import describe_model

    save_tokenizer_hf(train_bpe(vocab_size=260), tmp_path / "fp8")
    assert ("weights: block-wise FP8 in the file (16x16 blocks), dequantized to bfloat16"
            in describe_model(tmp_path / "fp8"))
    # what pivotflow writes of it is a plain bf16 folder of those weights
    save_checkpoint(tmp_path / "ours", ours.config, ours.tensors)
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert "quantization_config" not in written
    again = load_model_folder(tmp_path / "ours")
    assert again.config == ours.config
    assert all(torch.equal(again.tensors[n], t) for n, t in ours.tensors.items())


def test_blocks_cut_short_at_a_ragged_edge_scale_the_values_they_cover(tmp_path: Path) -> None:
    """DeepSeek-V3's kv_a_proj_with_mqa has 576 rows in 5 blocks of 128: the last block's
    scale covers the 64 rows left. Here 48-wide weights in blocks of 32: each value is its code
    times its own block's scale."""
    save_folder(DEEPSEEK_V3, tmp_path / "bf16")
    quantized = _fp8_folder(tmp_path / "bf16", tmp_path / "fp8", (32, 32))
    ours = load_model_folder(tmp_path / "fp8")
    name = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"  # [48, 128]: rows 32 + 16
    codes, scales = quantized[name], quantized[name.replace("weight", "weight_scale_inv")]
    assert codes.shape == (48, 128) and scales.shape == (2, 4)
    for r in range(48):
        for c in range(0, 128, 7):
            want = torch.tensor(float(codes[r, c].float()) * float(scales[r // 32, c // 32]))
            assert ours.tensors[name][r, c] == want.to(torch.bfloat16), (r, c)


def test_fp8_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    save_folder(DEEPSEEK_V3, tmp_path / "bf16")
    _fp8_folder(tmp_path / "bf16", tmp_path / "fp8", (16, 16))
    tensors = load_file(str(tmp_path / "fp8" / "model.safetensors"))
    del tensors["model.layers.0.self_attn.o_proj.weight_scale_inv"]
    save_file(tensors, str(tmp_path / "fp8" / "model.safetensors"))
    with pytest.raises(ModelConfigError, match=r"FP8 tensor 'model\.layers\.0\.self_attn\.o_proj"
                       r"\.weight' has no 'model\.layers\.0\.self_attn\.o_proj\.weight_scale_inv'"
                       r" of shape \(8, 6\) beside it") as exc:
        load_model_folder(tmp_path / "fp8")
    assert "\n" not in str(exc.value) and str(tmp_path / "fp8") in str(exc.value)
    config = json.loads((tmp_path / "fp8" / "config.json").read_text())
    config["quantization_config"]["weight_block_size"] = [128]
    (tmp_path / "fp8" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match=r"weight_block_size=\[128\] is not two positive"):
        load_model_folder(tmp_path / "fp8")
