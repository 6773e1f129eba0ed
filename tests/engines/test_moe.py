"""Qwen3-MoE in the decoder the trainer runs: the same logits and gradients as transformers on a
padded batch, checkpoints transformers rebuilds, routing that matches a per-expert scan, and
one-line errors for expert settings that cannot be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_fixtures import MOE, PROMPTS, hf_model

from pivotflow.engines.torch import config_from_hf, load_model_folder, save_checkpoint
from pivotflow.engines.torch.model import Decoder, SparseMoE, route, sort_by_expert
from pivotflow.engines.torch.weights import build_model
from pivotflow.errors import ModelConfigError


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Decoder, Path]:
    """transformers' Qwen3-MoE, ours loaded from the folder it saved, and that folder."""
    root = tmp_path_factory.mktemp("moe")
    theirs = hf_model(MOE)
    theirs.save_pretrained(root)
    folder = load_model_folder(root)
    return theirs, build_model(folder.config, folder.tensors), root


def _padded() -> tuple[torch.Tensor, torch.Tensor]:
    """PROMPTS right-padded into one batch, and its attention mask."""
    width = max(map(len, PROMPTS))
    ids = torch.tensor([p + [0] * (width - len(p)) for p in PROMPTS])
    mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in PROMPTS])
    return ids, mask


def test_sparse_and_dense_layers_are_where_the_config_puts_them(pair: Any) -> None:
    _, ours, _ = pair
    kinds = [type(layer.mlp).__name__ for layer in ours.model.layers]
    assert kinds == ["SparseMoE", "MLP", "SparseMoE"]  # mlp_only_layers=[1]
    assert len(ours.model.layers[0].mlp.experts) == 8


def test_logits_and_gradients_equal_transformers_on_a_padded_batch(pair: Any) -> None:
    theirs, ours, _ = pair
    ours.requires_grad_(True)  # build_model loads for inference
    ids, mask = _padded()
    real = mask.bool()
    ref = theirs(ids, attention_mask=mask).logits
    got = ours(ids, attention_mask=mask)
    torch.testing.assert_close(got[real], ref[real], atol=2e-5, rtol=0)
    # The same loss through both: every weight's gradient agrees, the router's included, and an
    # expert's is the slice of transformers' fused tensor that holds it.
    weights = torch.linspace(-1.0, 1.0, ref.shape[-1])
    (ref[real] * weights).sum().backward()
    (got[real] * weights).sum().backward()
    theirs_grads = dict(theirs.named_parameters())
    inter = MOE.extra["moe_intermediate_size"]
    for name, p in ours.named_parameters():
        parts = name.split(".")  # model.layers.0.mlp.experts.3.up_proj.weight
        if "experts" in parts:
            at = parts.index("experts")
            expert, proj, fused = int(parts[at + 1]), parts[at + 2], ".".join(parts[: at + 1])
            if proj == "down_proj":
                expected = theirs_grads[f"{fused}.down_proj"].grad[expert]
            else:  # transformers' gate_up_proj: gate's rows, then up's
                gate_up = theirs_grads[f"{fused}.gate_up_proj"].grad[expert]
                expected = gate_up[:inter] if proj == "gate_proj" else gate_up[inter:]
        else:
            expected = theirs_grads[name].grad
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, expected, atol=1e-4, rtol=1e-4, msg=name)
    router = ours.model.layers[0].mlp.gate.weight.grad
    assert router is not None and float(router.abs().sum()) > 0


def test_a_checkpoint_we_write_transformers_rebuilds(pair: Any, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    theirs, _, root = pair
    folder = load_model_folder(root)
    save_checkpoint(tmp_path, folder.config, folder.tensors)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == ["Qwen3MoeForCausalLM"]
    assert (written["num_experts"], written["mlp_only_layers"]) == (8, [1])
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert load_model_folder(tmp_path).config == folder.config
    ids = torch.tensor([PROMPTS[2] * 4])
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, theirs(ids).logits, atol=1e-5, rtol=0)


def test_routing_matches_a_scan_of_every_expert() -> None:
    torch.manual_seed(0)
    for normalize in (False, True):
        logits = torch.randn(37, 6)
        weights, chosen = route(logits, 3, normalize)
        probs = logits.softmax(-1)
        assert torch.equal(chosen, probs.topk(3).indices)
        expected = probs.gather(-1, chosen)
        if normalize:
            expected = expected / expected.sum(-1, keepdim=True)
        torch.testing.assert_close(weights, expected)
        order, counts = sort_by_expert(chosen, 6)
        assert counts == [int((chosen == e).sum()) for e in range(6)]
        start = 0
        for expert, count in enumerate(counts):  # each expert's pairs, one slice apiece
            pairs = order[start:start + count]
            assert torch.equal(chosen.reshape(-1)[pairs], torch.full_like(pairs, expert))
            assert sorted((pairs // 3).tolist()) == torch.nonzero(chosen == expert)[:, 0].tolist()
            start += count


def test_an_expert_no_token_chose_gets_no_gradient() -> None:
    cfg = config_from_hf({**_moe_config(), "num_experts": 16, "num_experts_per_tok": 1}, "t")
    torch.manual_seed(0)
    block = SparseMoE(cfg)
    x = torch.randn(1, 3, cfg.hidden_size)  # 3 tokens, 1 expert each: at most 3 of 16 run
    block(x).sum().backward()
    ran = [e for e, m in enumerate(block.experts) if m.up_proj.weight.grad is not None]
    assert 1 <= len(ran) <= 3


def _moe_config(**changes: Any) -> dict[str, Any]:
    return {"model_type": "qwen3_moe", "vocab_size": 50, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "max_position_embeddings": 64, "num_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 16, **changes}  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_experts_per_tok": 5}, r"t: num_experts_per_tok must be in \[1, num_experts=4\]"),
        ({"moe_intermediate_size": 0}, r"t: moe_intermediate_size must be positive, got 0"),
        ({"mlp_only_layers": [2]}, r"t: mlp_only_layers \[2\] are not layers of a 2-layer"),
        ({"mlp_only_layers": "1"}, r"t: mlp_only_layers='1' is not a list of layer numbers"),
        ({"num_experts": -1}, r"t: num_experts=-1 is not a non-negative integer"),
        ({"decoder_sparse_step": 1.5}, r"t: decoder_sparse_step=1.5 is not a non-negative"),
    ],
)
def test_expert_settings_that_cannot_be_are_one_line_errors(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ModelConfigError, match=message) as exc:
        config_from_hf(_moe_config(**changes), "t")
    assert "\n" not in str(exc.value)


def test_the_hub_and_transformers_5_names_of_the_expert_count_both_read() -> None:
    hub = _moe_config()
    v5 = {k: v for k, v in hub.items() if k != "num_experts"} | {"num_local_experts": 4}
    assert config_from_hf(hub, "t") == config_from_hf(v5, "t")
    assert config_from_hf(hub, "t").num_experts == 4
    dense = config_from_hf({**hub, "num_experts": 0}, "t")  # transformers builds it all dense
    assert not any(dense.is_sparse(i) for i in range(2))


@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_the_serving_path_computes_the_sparse_block(tokens: int) -> None:
    """PackedExperts (the engine's) equals SparseMoE (the trainer's) on a step of one token
    (2 of 8 experts run) or of many (all of them)."""
    from pivotflow.engines.torch import experts as packed_experts
    from pivotflow.engines.torch.linear import Linears

    cfg = config_from_hf({**_moe_config(), "num_experts": 8, "norm_topk_prob": True}, "t")
    torch.manual_seed(tokens)
    block = SparseMoE(cfg).requires_grad_(False)
    h = torch.randn(tokens, cfg.hidden_size)
    expected = block(h[None])[0]
    packed = packed_experts.PackedExperts(block, Linears(onednn=False))
    residual = torch.randn(tokens, cfg.hidden_size)
    got = packed.add(h, residual.clone())
    torch.testing.assert_close(got - residual, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(block(h[None])[0], expected)  # the module reads the stacks now
