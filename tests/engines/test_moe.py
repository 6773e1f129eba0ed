"""Qwen3-MoE in the decoder the trainer runs: the same logits and gradients as transformers on a
padded batch, checkpoints transformers rebuilds, routing that matches a per-expert scan, and
one-line errors for expert settings that cannot be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_fixtures import (
    DEEPSEEK_V2,
    DEEPSEEK_V2_LITE,
    DEEPSEEK_V3,
    DEEPSEEK_V3_PLAIN,
    GLM4_MOE,
    MIXTRAL,
    MOE,
    OLMOE,
    PROMPTS,
    QWEN2_MOE,
    SIZES,
    hf_model,
)

from pivotflow.engines.torch import config_from_hf, load_model_folder, save_checkpoint
from pivotflow.engines.torch.feedforward import (
    Routing,
    SparseMoE,
    route,
    router_logits,
    sort_by_expert,
)
from pivotflow.engines.torch.model import Decoder
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


@pytest.mark.parametrize("case", [MOE, MIXTRAL, GLM4_MOE, QWEN2_MOE, OLMOE, DEEPSEEK_V3,
                                  DEEPSEEK_V3_PLAIN, DEEPSEEK_V2, DEEPSEEK_V2_LITE],
                         ids=lambda c: c.name)
def test_logits_and_gradients_equal_transformers_on_a_padded_batch(
        case: Any, pair: Any, tmp_path: Path) -> None:
    """Qwen3-MoE, Mixtral (whose file names its layer block_sparse_moe and its experts'
    projections w1/w3/w2; transformers 5 holds both as Qwen3-MoE's fused stacks), GLM-4.5
    (grouped sigmoid routing with a correction bias, scaled weights, a shared expert) and
    Qwen2-MoE (a shared expert scaled by a sigmoid gate, a window on its first layer),
    OLMoE (whole-projection q/k norms), DeepSeek-V3 (GLM-4.5's experts behind latent
    attention: every latent projection's and norm's gradient) and DeepSeek-V2 (a softmax
    router, grouped by each group's best expert or not, its weights scaled)."""
    if case is MOE:
        theirs, ours, _ = pair
    else:
        theirs = hf_model(case)
        theirs.save_pretrained(tmp_path)
        folder = load_model_folder(tmp_path)
        ours = build_model(folder.config, folder.tensors)
    ours.requires_grad_(True)  # build_model loads for inference
    ids, mask = _padded()
    real = mask.bool()
    ref = theirs(ids, attention_mask=mask).logits
    got = ours(ids, attention_mask=mask)
    # (DeepSeek-V2's experts, unnormalised and times 16, give MLP outputs of ~170 here where
    # the others' are ~20, with float32's rounding of them: 10x the tolerance)
    loose = 10 if case in (DEEPSEEK_V2, DEEPSEEK_V2_LITE) else 1
    torch.testing.assert_close(got[real], ref[real], atol=2e-5 * loose, rtol=0)
    # The same loss through both: every weight's gradient agrees, the router's included, and an
    # expert's is the slice of transformers' fused tensor that holds it.
    weights = torch.linspace(-1.0, 1.0, ref.shape[-1])
    (ref[real] * weights).sum().backward()
    (got[real] * weights).sum().backward()
    theirs_grads = dict(theirs.named_parameters())
    inter = case.extra.get("moe_intermediate_size", SIZES["intermediate_size"])
    for name, p in ours.named_parameters():
        if name.endswith("e_score_correction_bias"):  # (frozen: a buffer in transformers)
            assert not p.requires_grad and p.grad is None
            continue
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
        if p.grad is None and "experts" in parts:  # (an expert no token chose: zeros there)
            assert not expected.any(), name
            continue
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, expected, atol=1e-4 * loose, rtol=1e-4 * loose,
                                   msg=lambda m, name=name: f"{name}: {m}")
    router = ours.model.layers[-1].mlp.gate.weight.grad
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
        weights, chosen = route(logits, Routing(3, normalize))
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


def _glm4_moe_config(**changes: Any) -> dict[str, Any]:
    """GLM-4.5's kind: a dense first layer, 8 experts in 4 groups (2 best groups a token),
    a shared expert, scaled weights."""
    return {"model_type": "glm4_moe", "vocab_size": 50, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 64,
            "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
            "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5, **changes}  # fmt: skip


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


@pytest.mark.parametrize(("changes", "message"), [
    ({"router_jitter_noise": 0.01}, r"^t: router_jitter_noise=0\.01 is not supported by the "
                                    r"embedded engine \(0\)$"),
    ({"num_local_experts": 0}, r"^t: num_local_experts=0 is not a positive integer$"),
])  # fmt: skip
def test_a_mixtral_setting_the_engine_cannot_run_is_a_one_line_error(
        changes: dict[str, Any], message: str) -> None:
    raw = {**SIZES, "model_type": "mixtral", "num_local_experts": 4, **changes}
    with pytest.raises(ModelConfigError, match=message):
        config_from_hf(raw, "t")
    cfg = config_from_hf({**SIZES, "model_type": "mixtral"}, "t")  # transformers' defaults
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.norm_topk_prob) == (8, 2, True)
    assert cfg.moe_intermediate_size == SIZES["intermediate_size"] and cfg.sparse_layers == 2


def test_the_hub_and_transformers_5_names_of_the_expert_count_both_read() -> None:
    hub = _moe_config()
    v5 = {k: v for k, v in hub.items() if k != "num_experts"} | {"num_local_experts": 4}
    assert config_from_hf(hub, "t") == config_from_hf(v5, "t")
    assert config_from_hf(hub, "t").num_experts == 4
    dense = config_from_hf({**hub, "num_experts": 0}, "t")  # transformers builds it all dense
    assert not any(dense.is_sparse(i) for i in range(2))


@pytest.mark.parametrize("kind", ["qwen3_moe", "glm4_moe", "qwen2_moe"])
@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_the_serving_path_computes_the_sparse_block(tokens: int, kind: str) -> None:
    """PackedExperts (the engine's) equals SparseMoE (the trainer's) on a step of one token
    (2 of 8 experts run) or of many (all of them); GLM-4.5's grouped sigmoid routing with its
    correction bias, scaled weights and shared expert, and Qwen2-MoE's gated shared expert,
    too."""
    from pivotflow.engines.torch import experts as packed_experts
    from pivotflow.engines.torch.linear import Linears, pack_mlp

    glm = kind == "glm4_moe"
    cfg = config_from_hf(_glm4_moe_config() if glm else {
        **_moe_config(model_type=kind), "num_experts": 8, "norm_topk_prob": True,
        "shared_expert_intermediate_size": 24}, "t")
    torch.manual_seed(tokens)
    block = SparseMoE(cfg).requires_grad_(False)
    if glm:  # (a bias that changes choices: scores are in (0, 1))
        block.gate.e_score_correction_bias.normal_(0.0, 0.2)
    assert (block.shared_expert_gate is not None) == (kind == "qwen2_moe")
    h = torch.randn(tokens, cfg.hidden_size)
    expected = block(h[None])[0]
    shared_mlp = block.shared_experts or block.shared_expert
    shared = None if shared_mlp is None else pack_mlp(shared_mlp)
    packed = packed_experts.PackedExperts(block, Linears(onednn=False), 0, shared)
    residual = torch.randn(tokens, cfg.hidden_size)
    got = packed.add(h, residual.clone())
    torch.testing.assert_close(got - residual, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(block(h[None])[0], expected)  # the module reads the stacks now


def _chosen_by(model: Decoder, ids: torch.Tensor, **kw: Any) -> list[torch.Tensor]:
    """Each sparse layer's own choice of experts (sorted per token) in one forward of ``model``
    on ``ids``, from the input each sparse block got."""
    seen: list[torch.Tensor] = []

    def choose(block: SparseMoE, inputs: tuple[torch.Tensor, ...], _out: Any) -> None:
        x = inputs[0].reshape(-1, inputs[0].shape[-1])
        logits = router_logits(block.gate, x, block.routing)
        seen.append(route(logits, block.routing, block.correction_bias)[1].sort(-1).values)

    hooks = [layer.mlp.register_forward_hook(choose)
             for layer in model.model.layers if isinstance(layer.mlp, SparseMoE)]  # fmt: skip
    with torch.no_grad():
        model(ids, **kw)
    for h in hooks:
        h.remove()
    return seen


@pytest.mark.parametrize("case", [MOE, GLM4_MOE], ids=lambda c: c.name)
def test_the_engine_records_the_experts_of_every_position_it_fed(
        case: Any, pair: Any, tmp_path: Path) -> None:
    """Five prompts on two slots (slots move as sequences finish), one resumed from a prefix:
    each output's routing holds every position but its last token, as a full forward of the
    same weights chooses them (GLM-4.5: with its groups and correction bias)."""
    from pivotflow.engines.base import GenerationRequest, SamplingParams
    from pivotflow.engines.torch import TorchEngine
    from pivotflow.engines.torch.feedforward import routing_from_bytes

    if case is MOE:
        _, ours, root = pair
    else:
        hf_model(case).save_pretrained(root := tmp_path)
    folder = load_model_folder(root)
    if case is not MOE:
        ours = build_model(folder.config, folder.tensors)
    engine = TorchEngine(folder.config, max_batch=2, record_routing=True)
    engine.load_weights(folder.tensors, 0)
    params = [SamplingParams(temperature=1.0, max_tokens=6 + i, seed=i) for i in range(5)]
    outs = engine.generate([GenerationRequest(f"p{i}", p, params[i])
                            for i, p in enumerate(PROMPTS)])  # fmt: skip
    first = outs[2]
    resumed = engine.generate([GenerationRequest("r", PROMPTS[2], params[2], first.token_ids[:3],
                                                 first.logprobs[:3], first.versions[:3])])[0]
    assert resumed.token_ids == first.token_ids and resumed.routing == first.routing
    for out, prompt in zip(outs, PROMPTS, strict=True):
        fed = prompt + out.token_ids[:-1]
        recorded = routing_from_bytes(out.routing, folder.config)
        assert recorded.shape == (len(fed), 2, 2)  # positions, sparse layers, experts a token
        forward = _chosen_by(ours, torch.tensor([fed]))
        for layer, chosen in enumerate(forward):
            assert torch.equal(recorded[:, layer].sort(-1).values, chosen), (out.request_id, layer)


def test_replayed_routing_is_what_the_trainer_uses_and_narrows_the_bf16_gap(
        tmp_path: Path) -> None:
    """A bf16 rollout flips some routing decisions against the trainer (fp32 weights under
    bf16 autocast); with the rollout's experts replayed, the trainer's logprobs come closer
    to the rollout's (which experts a replayed forward runs: the next test)."""
    from pivotflow.engines.base import GenerationRequest, SamplingParams
    from pivotflow.engines.torch import TorchEngine
    from pivotflow.engines.torch.feedforward import routing_from_bytes

    cfg = config_from_hf(_moe_config(vocab_size=300, hidden_size=64, num_experts=32,
                                     num_experts_per_tok=4, max_position_embeddings=128), "t")
    torch.manual_seed(3)
    model = Decoder(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
    engine = TorchEngine(cfg, max_batch=8, dtype="bf16", record_routing=True)
    engine.load_weights(tensors, 0)
    prompts = [[(7 * i + j) % 300 for j in range(6)] for i in range(8)]
    outs = engine.generate([GenerationRequest(f"b{i}", p, SamplingParams(
        temperature=1.0, max_tokens=24, seed=i)) for i, p in enumerate(prompts)])  # fmt: skip
    ids = torch.tensor([p + o.token_ids for p, o in zip(prompts, outs, strict=True)])
    routing = torch.full((*ids.shape, 2, 4), -1, dtype=torch.int16)
    for i, o in enumerate(outs):
        recorded = routing_from_bytes(o.routing, cfg)
        routing[i, : recorded.shape[0]] = recorded.to(torch.int16)
    rollout = torch.tensor([o.logprobs for o in outs])
    gaps, flips = {}, 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        own = _chosen_by(model, ids)
        for name, kw in (("own", {}), ("replayed", {"routing": routing})):
            with torch.no_grad():
                logits = model(ids, **kw)[:, 5:-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 6:, None])[..., 0]
            gaps[name] = (logp - rollout).abs()
    for layer in range(2):
        wanted = routing[:, :-1, layer].long().sort(-1).values.reshape(-1, 4)
        flips += int((own[layer].view(*ids.shape, 4)[:, :-1].reshape(-1, 4) != wanted)
                     .any(-1).sum())
    assert flips > 0, "no routing decision differs: the test shows nothing"
    assert float(gaps["replayed"].max()) < float(gaps["own"].max())
    assert float(gaps["replayed"].mean()) < float(gaps["own"].mean())


@pytest.mark.parametrize("normalize", [False, True])
def test_a_replayed_route_takes_the_given_experts_weighed_by_this_router(
        normalize: bool) -> None:
    from pivotflow.engines.torch.feedforward import replayed_route

    torch.manual_seed(0)
    logits = torch.randn(5, 8, requires_grad=True)
    given = torch.tensor([[7, 0], [-1, -1], [3, 4], [1, 2], [-1, -1]])
    weights, experts = replayed_route(logits, given, Routing(2, normalize))
    own_weights, own = route(logits, Routing(2, normalize))
    for row in (0, 2, 3):  # replayed: the given experts, weighed as route weighs its own
        assert experts[row].tolist() == given[row].tolist()
        expected = logits[row].softmax(-1)[given[row]]
        expected = expected / expected.sum() if normalize else expected
        torch.testing.assert_close(weights[row], expected)
    for row in (1, 4):  # -1: the router's own choice
        assert torch.equal(experts[row], own[row])
        torch.testing.assert_close(weights[row], own_weights[row])
    (weights * torch.tensor([1.0, 3.0])).sum().backward()  # (normalised weights sum to 1)
    assert logits.grad is not None and float(logits.grad[0].abs().sum()) > 0  # the router learns


def test_grouped_sigmoid_routing_is_transformers_glm4_5_router() -> None:
    """Choices and weights as transformers' Glm4MoeTopkRouter gives them: 16 experts in 4
    groups, a token's 3 from its 2 best groups, chosen with the correction bias and weighed
    without it, renormalised, times 2.5."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeTopkRouter

    raw = _glm4_moe_config(n_routed_experts=16, num_experts_per_tok=3, n_group=4, topk_group=2)
    theirs = Glm4MoeTopkRouter(transformers.Glm4MoeConfig(**raw))
    torch.manual_seed(0)
    with torch.no_grad():
        theirs.weight.normal_(0.0, 0.5)
        theirs.e_score_correction_bias.normal_(0.0, 0.3)
    x = torch.randn(64, 32)
    _, their_weights, their_chosen = theirs(x)
    cfg = config_from_hf(raw, "t")
    gate = torch.nn.Linear(32, 16, bias=False)
    gate.weight.data.copy_(theirs.weight)
    routing = Routing.of(cfg)
    weights, chosen = route(router_logits(gate, x, routing), routing,
                            theirs.e_score_correction_bias)
    order, their_order = chosen.argsort(-1), their_chosen.argsort(-1)
    assert torch.equal(chosen.gather(-1, order), their_chosen.gather(-1, their_order))
    torch.testing.assert_close(weights.gather(-1, order), their_weights.gather(-1, their_order))
    groups = chosen // 4  # every token's experts come from at most its 2 best groups
    assert all(len(set(row.tolist())) <= 2 for row in groups)
    plain, _ = route(router_logits(gate, x, routing), routing)
    assert not torch.equal(plain, weights)  # (the bias changed some choices: it is used)


@pytest.mark.parametrize(("changes", "says"), [
    ({"n_group": 3}, "n_group 3 does not divide num_experts 8"),
    ({"topk_group": 5}, "topk_group must be in [1, n_group=4], got 5"),
    ({"num_experts_per_tok": 5, "topk_group": 2}, "num_experts_per_tok 5 is more than the 4"),
    ({"first_k_dense_replace": 3}, "first_k_dense_replace=3 is not a number of layers in [0, 2]"),
    ({"routed_scaling_factor": 0}, "routed_scaling_factor must be positive"),
    ({"use_qk_norm": "yes"}, "use_qk_norm='yes' is not true or false"),
])
def test_a_glm4_5_router_that_cannot_be_is_one_line(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ModelConfigError) as e:
        config_from_hf(_glm4_moe_config(**changes), "cfg.json")
    assert says in str(e.value) and str(e.value).startswith("cfg.json: ")
    assert "\n" not in str(e.value)


def test_recording_routing_on_a_dense_model_is_one_line() -> None:
    from pivotflow.engines.torch import TorchEngine
    from pivotflow.errors import EngineError

    dense = config_from_hf({**_moe_config(), "model_type": "qwen3"}, "t")
    with pytest.raises(EngineError, match="record_routing needs a mixture-of-experts model") as e:
        TorchEngine(dense, record_routing=True)
    assert "\n" not in str(e.value)


def test_lora_adapts_every_expert_and_not_the_router_and_merges_under_hub_names() -> None:
    """LoRA's default targets (gate_proj, up_proj, down_proj, ...) match each expert's linears,
    as PEFT's same targets do, and not the router (``gate``); the merged state is a plain
    model's, which the store and vLLM load."""
    from pivotflow.defaults import LORA_TARGETS
    from pivotflow.engines.torch.weights import check_tensors
    from pivotflow.worker.lora import adapter_tensors, apply_lora, merged_state_dict

    cfg = config_from_hf(_moe_config(), "t")  # 2 sparse layers of 4 experts
    torch.manual_seed(0)
    model = Decoder(cfg)
    assert apply_lora(model, 4, 8.0, list(LORA_TARGETS)) == 2 * (4 + 4 * 3)  # q/k/v/o, experts
    adapters = adapter_tensors(model)
    assert "model.layers.1.mlp.experts.3.down_proj.lora_A" in adapters
    assert not any(".mlp.gate." in k for k in adapters)
    for p in (p for k, p in model.named_parameters() if "lora_B" in k):
        torch.nn.init.normal_(p)  # (B starts at zero: a nonzero update to merge)
    ids = torch.randint(0, cfg.vocab_size, (2, 9))
    with torch.no_grad():
        adapted = model(ids)
    merged = merged_state_dict(model)
    check_tensors(cfg, merged, "merged")
    plain = build_model(cfg, merged)
    with torch.no_grad():
        torch.testing.assert_close(plain(ids), adapted, atol=1e-4, rtol=1e-4)


def test_a_bf16_glm4_5_keeps_its_router_in_float32_and_trains_it(tmp_path: Path) -> None:
    """As transformers and vLLM hold it: the sigmoid router's weight and correction bias stay
    float32 in a bf16 model (its choices decide which experts run); a bf16 forward under
    autocast and its backward reach the router in float32, the bias untouched."""
    hf_model(GLM4_MOE).save_pretrained(tmp_path)
    folder = load_model_folder(tmp_path)
    ours = build_model(folder.config, folder.tensors, dtype="bf16").requires_grad_(True)
    gate = ours.model.layers[1].mlp.gate
    assert gate.weight.dtype == gate.e_score_correction_bias.dtype == torch.float32
    assert ours.model.layers[1].mlp.experts[0].up_proj.weight.dtype == torch.bfloat16
    ids, mask = _padded()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = ours(ids, attention_mask=mask)
    logits.float()[mask.bool()].logsumexp(-1).sum().backward()
    assert gate.weight.grad is not None and gate.weight.grad.dtype == torch.float32
    assert float(gate.weight.grad.abs().sum()) > 0 and gate.e_score_correction_bias.grad is None
