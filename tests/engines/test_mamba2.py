"""Granite 4.0-H's and Nemotron-H's Mamba2 layers beyond the shared per-family tests (test_hf_models.py: greedy
and logprobs; test_families_and_windows.py: the trainer's forward, gradients and written
config): the chunked scan against the token-by-token one across chunk edges, the trainer's
layer against transformers' on its own, the engine's states over long prompts and sequences
joining and leaving, bf16, the Hub's config spellings, and the one-line errors."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_fixtures import (
    GRANITE4_H,
    GRANITE4_MAMBA,
    NEMOTRON_H,
    NEMOTRON_MAMBA,
    SIZES,
    assert_config_error,
    assert_states_follow_long_prompts,
    bf16_logprob_errors,
)

from pivotflow.engines.torch import config_from_hf
from pivotflow.engines.torch.mamba2 import Mamba2, ssd_chunked, ssd_step

transformers = pytest.importorskip("transformers")


def test_the_chunked_scan_equals_it_token_by_token_across_chunks_and_padding() -> None:
    """150 positions (three chunks of 64, the last ragged) from a given state: every output and
    the final state equal the recurrence run one token at a time; padding (a time step of 0)
    after a row's end leaves its state as it was there."""
    gen = torch.Generator().manual_seed(0)
    b, h, t, p, n = 2, 3, 150, 8, 12
    x, bs, cs = (torch.randn(b, h, t, d, generator=gen) for d in (p, n, n))
    dt = torch.rand(b, h, t, generator=gen) * 0.5
    a = -torch.rand(h, generator=gen) - 0.1
    start = torch.randn(b, h, p, n, generator=gen) * 0.1
    out, final = ssd_chunked(x, dt, a, bs, cs, start.clone())
    state, steps = start.clone(), []
    for i in range(t):
        steps.append(ssd_step(x[:, :, i], dt[:, :, i], a, bs[:, :, i], cs[:, :, i], state))
    torch.testing.assert_close(out, torch.stack(steps, 2), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final, state, atol=1e-5, rtol=1e-5)
    real = torch.arange(t) < torch.tensor([100, 150])[:, None]
    _, padded_final = ssd_chunked(x, dt * real[:, None], a, bs, cs, start.clone())
    _, at_100 = ssd_chunked(x[:1, :, :100], dt[:1, :, :100], a, bs[:1, :, :100],
                            cs[:1, :, :100], start[:1].clone())
    torch.testing.assert_close(padded_final[:1], at_100, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded_final[1:], final[1:], atol=1e-5, rtol=1e-5)


def test_the_layer_equals_transformers_mamba_layer_with_groups_and_a_clamped_step() -> None:
    """The trainer's Mamba2 layer, loaded with the state dict of transformers' (2 groups of B
    and C, a time step clamped to [0.05, 0.8], biased projections), gives its output over 150
    positions (three of our chunks, and transformers' own chunking)."""
    from transformers.models.granitemoehybrid.modeling_granitemoehybrid import (
        GraniteMoeHybridMambaLayer,
    )

    extra = {**GRANITE4_MAMBA, "mamba_proj_bias": True, "time_step_limit": (0.05, 0.8),
             "mamba_chunk_size": 32, "layer_types": ["mamba", "attention"]}
    hf_config = transformers.GraniteMoeHybridConfig(**{**SIZES, **extra})
    torch.manual_seed(0)
    theirs = GraniteMoeHybridMambaLayer(hf_config, 0).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0.0, 0.3)
    cfg = config_from_hf(hf_config.to_dict(), "c.json")
    assert cfg.time_step_limit == (0.05, 0.8) and cfg.mamba_proj_bias
    ours = Mamba2(cfg)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 150, SIZES["hidden_size"])
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", [GRANITE4_H, NEMOTRON_H], ids=lambda c: c.name)
def test_states_follow_long_prompts_and_sequences_joining_and_leaving(tmp_path: Path,
                                                                    case: Any) -> None:
    """Prompts of 70 and 100 tokens (past one chunk) among short ones, through an engine of 2
    slots: prompts wait, join a running batch and leave it at different lengths (the last slot
    moves into the hole, its states with it). Every greedy continuation equals transformers'
    on its prompt alone (Nemotron-H's layers one block each: its MLP blocks hold no cache)."""
    assert_states_follow_long_prompts(case, tmp_path)


def test_bf16_is_as_close_to_float32_as_transformers_own_bf16(tmp_path: Path) -> None:
    """The engine in bf16 (its Mamba2 states in float32, as transformers' and vLLM's) is as far
    from the float32 model as transformers' own bf16 model is, pooled over three seeds' sampled
    tokens. Measured: engine mean 0.0020, max 0.026; transformers' 0.0020, 0.035."""
    ours, reference = bf16_logprob_errors(GRANITE4_H, tmp_path)
    assert float(reference.mean()) > 0.001  # (bf16 does matter here)
    assert float(ours.mean()) <= 1.25 * float(reference.mean())
    assert float(ours.max()) <= 1.25 * float(reference.max())


BASE = {**SIZES, **GRANITE4_MAMBA, "model_type": "granitemoehybrid", "num_hidden_layers": 4,
        "layer_types": ["mamba", "mamba", "attention", "mamba"], "num_local_experts": 0,
        "shared_intermediate_size": 96}


def test_the_hubs_spellings_read_alike() -> None:
    """The Hub's configs say "mamba"/"attention" (transformers 5: "linear_attention"/
    "full_attention"; older ones ``layers_block_type``), ``mamba_d_head`` "auto", and an
    unlimited time step as null or transformers 5's ``{"__float__": "Infinity"}``."""
    plain = config_from_hf(BASE, "c.json")
    assert plain.linear_attention_layers == (0, 1, 3) and plain.mamba_d_head == 16
    assert plain.time_step_limit == (0.0, math.inf)
    for change in ({"layer_types": ["linear_attention"] * 2 + ["full_attention",
                                                                "linear_attention"]},
                   {"layer_types": None, "layers_block_type": BASE["layer_types"]},
                   {"mamba_d_head": "auto"},
                   {"time_step_limit": [0.0, {"__float__": "Infinity"}]},
                   {"time_step_limit": [0.0, None]}):
        assert config_from_hf({**BASE, **change}, "c.json") == plain, change
    # with no layer types at all, every layer is Mamba2 (GraniteMoeHybridConfig's default)
    assert config_from_hf({k: v for k, v in BASE.items() if k != "layer_types"},
                          "c.json").linear_attention_layers == (0, 1, 2, 3)


@pytest.mark.parametrize(("change", "message"), [
    ({"layer_types": ["mamba", "sliding_attention", "mamba", "attention"]},
     "layer_types=[...] is not supported by the embedded engine on granitemoehybrid (mamba, "
     "attention)"),
    ({"mamba_n_heads": 6, "mamba_d_head": "auto"}, "mamba_n_heads=6 does not divide mamba_expand * hidden_size (128)"),
    ({"mamba_n_heads": 8, "mamba_d_head": 8},
     "mamba_n_heads 8 x mamba_d_head 8 must be mamba_expand 2 x hidden_size 64"),
    ({"mamba_n_groups": 3}, "mamba_n_heads 8 is not a multiple of mamba_n_groups 3"),
    ({"mamba_d_state": 0}, "mamba_d_state=0 is not an integer >= 1"),
    ({"mamba_conv_bias": "yes"}, "mamba_conv_bias='yes' is not true or false"),
    ({"time_step_limit": [0.5, 0.1]},
     "time_step_limit [0.5, 0.1] must be [low, high] with 0 <= low < high"),
    ({"time_step_limit": "wide"}, "time_step_limit='wide' is not [low, high]"),
    ({"position_embedding_type": "alibi"},
     "position_embedding_type='alibi' is not supported by the embedded engine (rope, nope, "
     "null)"),
    ({"layer_types": ["mamba"] * 3}, "layer_types has 3 entries for 4 layers"),
])
def test_a_bad_granite_config_is_a_one_line_error(change: dict[str, Any], message: str) -> None:
    assert_config_error({**BASE, **change}, message)


NEMOTRON = {**SIZES, **NEMOTRON_MAMBA, "model_type": "nemotron_h",
            "hybrid_override_pattern": "M-M*-M-"}


def test_nemotrons_spellings_read_alike() -> None:
    """The Hub's configs give Nemotron-H's blocks as ``hybrid_override_pattern`` (M, *, -);
    transformers 5 writes ``layers_block_type`` in its names and no num_hidden_layers."""
    plain = config_from_hf(NEMOTRON, "c.json")
    assert plain.linear_attention_layers == (0, 2, 5) and plain.mlp_blocks == (1, 4, 6)
    assert plain.attention_layers == (3,) and plain.num_hidden_layers == 7
    names = ["linear_attention", "mlp", "linear_attention", "full_attention", "mlp",
             "linear_attention", "mlp"]
    for change in ({"hybrid_override_pattern": None, "layers_block_type": names},
                   {"hybrid_override_pattern": None,
                    "layer_types": [{"linear_attention": "mamba", "full_attention": "attention"}
                                    .get(n, n) for n in names]},
                   {"num_hidden_layers": 52}):  # (the blocks decide, as transformers)
        assert config_from_hf({**NEMOTRON, **change}, "c.json") == plain, change


@pytest.mark.parametrize(("change", "message"), [
    ({"hybrid_override_pattern": "M-E*", "moe_latent_size": 32},
     "moe_latent_size=32 is not supported by the embedded engine on nemotron_h (None)"),
    ({"hybrid_override_pattern": "M-E*", "n_routed_experts": 0},
     "n_routed_experts=0 is not an integer >= 1"),
    ({"hybrid_override_pattern": "M-X"},
     "layer types 'M-X' are not Nemotron-H's blocks (M, *, -, E; or mamba, attention, mlp, "
     "moe)"),
    ({"tie_word_embeddings": True},
     "tie_word_embeddings=True is not supported by the embedded engine on nemotron_h (False)"),
    ({"mamba_hidden_act": "gelu"},
     "mamba_hidden_act='gelu' is not supported by the embedded engine on nemotron_h (silu)"),
    ({"num_nextn_predict_layers": 1},
     "num_nextn_predict_layers=1 is not supported by the embedded engine on nemotron_h (0)"),
    ({"n_groups": 3}, "mamba_n_heads 4 is not a multiple of mamba_n_groups 3"),
    ({"ssm_state_size": 0}, "ssm_state_size=0 is not an integer >= 1"),
])
def test_a_bad_nemotron_config_is_a_one_line_error(change: dict[str, Any], message: str) -> None:
    assert_config_error({**NEMOTRON, **change}, message)
