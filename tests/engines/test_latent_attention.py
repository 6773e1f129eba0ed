"""DeepSeek-V3's configs as pivotflow reads them: the Hub's own config.json of DeepSeek-V3
(and Moonlight's) gives the geometry and score scale transformers builds, and what the
embedded engine cannot run is a one-line error naming the file and the key. (The math itself:
``hf_fixtures``' two DeepSeek cases against transformers in test_hf_models, test_moe and
test_families_and_windows.)"""

from __future__ import annotations

import math
from typing import Any

import pytest

from pivotflow.engines.torch.hf_config import config_from_hf, config_to_hf
from pivotflow.errors import ModelConfigError

# DeepSeek-V3's config.json as the Hub ships it (its remote code's keys included, and the FP8
# quantization left out: see test_fp8's folders)
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1,
    "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "seq_aux": True, "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "use_cache": True, "v_head_dim": 128, "vocab_size": 129280}
# Moonlight-16B-A3B's kind: no query latent, 64 experts in one group, plain rope
MOONLIGHT = {**DEEPSEEK_V3, "hidden_size": 2048, "intermediate_size": 11264,
             "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2,
             "n_group": 1, "topk_group": 1, "num_experts_per_tok": 6, "num_hidden_layers": 27,
             "num_attention_heads": 16, "num_key_value_heads": 16, "q_lora_rank": None,
             "first_k_dense_replace": 1, "routed_scaling_factor": 2.446,
             "rope_scaling": None, "rope_theta": 50000.0, "max_position_embeddings": 8192,
             "vocab_size": 163840, "num_nextn_predict_layers": 0}


def test_deepseek_v3s_own_config_reads_as_transformers_builds_it() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = config_from_hf(DEEPSEEK_V3, "config.json")
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.v_head_dim) == (1536, 512, 128)
    assert (cfg.head_dim, cfg.rotary_dim, cfg.rope_interleave) == (192, 64, True)
    assert (cfg.num_experts, cfg.n_group, cfg.topk_group, cfg.mlp_only_layers) == (
        256, 8, 4, (0, 1, 2))
    assert cfg.scoring_func == "sigmoid" and cfg.routed_scaling_factor == 2.5
    # the score scale: 192 ** -0.5 times YaRN's mscale_all_dim term squared, as transformers'
    theirs = transformers.DeepseekV3Config(**DEEPSEEK_V3)
    attention = transformers.models.deepseek_v3.modeling_deepseek_v3.yarn_apply_mscale(
        theirs.rope_parameters, theirs.qk_head_dim ** -0.5)
    assert cfg.attention_scale == pytest.approx(attention, rel=1e-12)
    assert cfg.attention_scale == pytest.approx(192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2)
    # written back, it reads the same (transformers' own head_dim: the rotary part's width)
    written = config_to_hf(cfg, __import__("torch").bfloat16)
    assert written["head_dim"] == 64 and written["q_lora_rank"] == 1536
    assert config_from_hf(written, "written") == cfg
    plain = config_from_hf(MOONLIGHT, "config.json")
    assert (plain.q_lora_rank, plain.head_dim, plain.n_shared_experts) == (0, 192, 2)
    assert plain.attention_scale == 192 ** -0.5 and plain.rope_type == "default"
    assert config_to_hf(plain, __import__("torch").bfloat16)["q_lora_rank"] is None


def test_latent_attention_is_deepseek_v3s_alone() -> None:
    with pytest.raises(ModelConfigError, match=r"latent attention \(q_lora_rank, kv_lora_rank"):
        from pivotflow.engines.torch.model_config import ModelConfig

        ModelConfig(vocab_size=10, architecture="llama", kv_lora_rank=8).validate()


# DeepSeek-V2-Lite's config.json as the Hub ships it
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False,
    "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001,
    "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "model_type": "deepseek_v2", "moe_intermediate_size": 1408, "moe_layer_freq": 1,
    "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": False,
    "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
    "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": None,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
    "seq_aux": True, "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy",
    "torch_dtype": "bfloat16", "use_cache": True, "v_head_dim": 128, "vocab_size": 102400}
# DeepSeek-V2's (236B) router: 160 experts in 8 groups, a token's 6 from its best 3
DEEPSEEK_V2 = {**DEEPSEEK_V2_LITE, "n_routed_experts": 160, "n_group": 8, "topk_group": 3,
               "topk_method": "group_limited_greedy", "routed_scaling_factor": 16.0,
               "q_lora_rank": 1536}


def test_deepseek_v2s_own_configs_read_as_transformers_builds_them() -> None:
    transformers = pytest.importorskip("transformers")
    import torch
    from transformers.models.deepseek_v2 import modeling_deepseek_v2

    lite = config_from_hf(DEEPSEEK_V2_LITE, "config.json")
    assert (lite.q_lora_rank, lite.head_dim, lite.rope_interleave) == (0, 192, True)
    assert (lite.scoring_func, lite.n_group, lite.norm_topk_prob) == ("softmax", 1, False)
    theirs = transformers.DeepseekV2Config(**DEEPSEEK_V2_LITE)
    scale = modeling_deepseek_v2.yarn_apply_mscale(theirs.rope_parameters,
                                                   theirs.qk_head_dim ** -0.5)
    assert lite.attention_scale == pytest.approx(scale, rel=1e-12)
    full = config_from_hf(DEEPSEEK_V2, "config.json")
    assert (full.n_group, full.topk_group, full.group_rank_top) == (8, 3, 1)
    assert full.routed_scaling_factor == 16.0 and full.q_lora_rank == 1536
    for cfg in (lite, full):
        written = config_to_hf(cfg, torch.bfloat16)
        assert config_from_hf(written, "written") == cfg
    assert config_to_hf(full, torch.bfloat16)["topk_method"] == "group_limited_greedy"


V3, V2 = DEEPSEEK_V3, DEEPSEEK_V2_LITE


@pytest.mark.parametrize(("base", "changes", "says"), [
    (V3, {"scoring_func": "softmax"},
     "scoring_func='softmax' is not supported by the embedded engine on deepseek_v3 ('sigmoid')"),
    (V3, {"topk_method": "group_limited_greedy"},
     "topk_method='group_limited_greedy' is not supported"),
    (V3, {"moe_layer_freq": 2}, "moe_layer_freq=2 is not supported"),
    (V3, {"num_key_value_heads": 64},
     "num_key_value_heads 64 must be num_attention_heads 128 in latent attention"),
    (V3, {"v_head_dim": 256}, "v_head_dim 256 wider than a key's 192"),
    (V3, {"kv_lora_rank": 0}, "kv_lora_rank must be positive, got 0"),
    (V3, {"q_lora_rank": -1}, "q_lora_rank=-1 is not a non-negative integer"),
    (V3, {"qk_rope_head_dim": 63}, "qk_rope_head_dim 63 must be even"),
    (V3, {"rope_interleave": "yes"}, "rope_interleave='yes' is not true or false"),
    (V3, {"quantization_config": {"quant_method": "awq"}}, "quantization_config="),
    (V2, {"norm_topk_prob": True},
     "norm_topk_prob=True is not supported by the embedded engine on deepseek_v2 (False)"),
    (V2, {"topk_method": "noaux_tc"}, "topk_method='noaux_tc' is not supported"),
    (V2, {"scoring_func": "sigmoid"}, "scoring_func='sigmoid' is not supported"),
    (V2, {"n_group": 3, "topk_method": "group_limited_greedy"}, "n_group 3 does not divide"),
])
def test_a_deepseek_config_the_engine_cannot_run_is_one_line(
        base: dict[str, Any], changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ModelConfigError) as e:
        config_from_hf({**base, **changes}, "cfg.json")
    assert says in str(e.value) and str(e.value).startswith("cfg.json: ")
    assert "\n" not in str(e.value)


def test_what_vllm_is_told_routes_as_transformers_does() -> None:
    """vLLM's DeepSeek reads router keys transformers ignores: a config without DeepSeek-V3's
    (as transformers writes one) is held saying them, and a DeepSeek-V2 greedy router's
    groups, which transformers ignores and vLLM would apply, are held as one group."""
    from pivotflow.params.held_config import held_config

    bare = {k: v for k, v in DEEPSEEK_V3.items()
            if k not in ("topk_method", "scoring_func", "moe_layer_freq")}
    held = held_config(bare)
    assert (held["topk_method"], held["scoring_func"], held["moe_layer_freq"]) == (
        "noaux_tc", "sigmoid", 1)
    assert held["num_nextn_predict_layers"] == 0 and config_from_hf(held, "h") == config_from_hf(
        DEEPSEEK_V3, "c")
    grouped = {**DEEPSEEK_V2_LITE, "n_group": 8, "topk_group": 3}
    assert (held_config(grouped)["n_group"], held_config(grouped)["topk_group"]) == (1, 1)
    assert config_from_hf(grouped, "c") == config_from_hf(held_config(grouped), "h")
    assert held_config(DEEPSEEK_V2)["n_group"] == 8  # (group_limited_greedy: its groups)


def test_lora_adapts_the_latent_projections_when_named(tmp_path: Any) -> None:
    """Named in lora_target_modules (not by default), LoRA adapts DeepSeek's latent
    projections: each takes an adapter, whose zero-initialised update leaves the model's
    logits as they were, and only the adapters train."""
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from hf_fixtures import DEEPSEEK_V3, PROMPTS, save_folder

    from pivotflow.defaults import LORA_LATENT_TARGETS
    from pivotflow.engines.torch.weights import build_model, load_model_folder
    from pivotflow.worker.lora import apply_lora
    from pivotflow.worker.train_config import train_config

    targets = ["o_proj", *LORA_LATENT_TARGETS]
    assert train_config({"lora_rank": 4, "lora_target_modules": targets}).lora_target_modules
    save_folder(DEEPSEEK_V3, tmp_path)
    folder = load_model_folder(tmp_path)
    model = build_model(folder.config, folder.tensors)
    ids = torch.tensor([PROMPTS[2]])
    before = model(ids)
    assert apply_lora(model, 4, 8.0, targets) == 3 * 5  # (3 layers: 4 latent projections, o)
    after = model(ids)
    torch.testing.assert_close(after, before)
    after.sum().backward()
    trained = {n.rsplit(".", 2)[-2] for n, p in model.named_parameters() if p.grad is not None}
    assert trained == {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"}
    assert all(n.endswith(("lora_A", "lora_B")) for n, p in model.named_parameters()
               if p.requires_grad)


def test_the_engine_caches_the_latent_alone() -> None:
    """The embedded engine's slots hold each position's latent and rotary key (one head of
    kv_lora_rank + qk_rope_head_dim) for every query head, not every head's key and value, and
    no values beside them (the keys' latent part is the values); the trainer's module serves
    through no other cache."""
    import torch

    from pivotflow.engines.torch import TorchEngine
    from pivotflow.engines.torch.model import Decoder
    from pivotflow.errors import EngineError

    cfg = config_from_hf({**MOONLIGHT, "hidden_size": 64, "num_hidden_layers": 2,
                          "intermediate_size": 64, "moe_intermediate_size": 16,
                          "vocab_size": 50, "max_position_embeddings": 64}, "c")
    engine = TorchEngine(cfg, max_batch=2, max_seq_len=32)
    engine.load_weights(Decoder(cfg).state_dict(), 0)
    cache = engine._cache
    assert cache is not None and (cache.n_kv, cache.head_dim) == (1, 512 + 64)
    assert cache.kv.shape[:2] == (2, 1)  # (2 layers, keys alone)
    with pytest.raises(EngineError, match="latent attention serves from the engine's latent"):
        Decoder(cfg)(torch.tensor([[1, 2]]), cache=cache)


@pytest.mark.parametrize("config_class", ["DeepseekV3Config", "DeepseekV2Config",
                                          "Mistral4Config"])
def test_a_deepseek_reward_model_scores_as_transformers(tmp_path: Any,
                                                       config_class: str) -> None:
    """A DeepSeek sequence classifier (a reward model or a PPO critic of the family:
    DeepseekV3ForSequenceClassification, DeepseekV2's, Mistral 4's) reads the last token's
    hidden state through its ``score`` head, behind latent attention and the experts, as
    transformers."""
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from hf_fixtures import DEEPSEEK_V2, DEEPSEEK_V3, MISTRAL4, PROMPTS, SIZES, sharpened

    from pivotflow.engines.torch.weights import build_model, load_model_folder

    transformers = pytest.importorskip("transformers")
    case = {"DeepseekV3Config": DEEPSEEK_V3, "DeepseekV2Config": DEEPSEEK_V2,
            "Mistral4Config": MISTRAL4}[config_class]
    config = getattr(transformers, config_class)(**{**SIZES, **case.extra}, num_labels=1)
    torch.manual_seed(0)
    classifier = config_class.replace("Config", "ForSequenceClassification")
    theirs = sharpened(getattr(transformers, classifier)(config))
    theirs.save_pretrained(tmp_path)
    folder = load_model_folder(tmp_path)
    assert folder.config.num_labels == 1 and folder.config.latent_attention
    ours = build_model(folder.config, folder.tensors)
    ids = torch.tensor([PROMPTS[2] * 3])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids)[0, -1], theirs(ids).logits[0], atol=1e-4,
                                   rtol=1e-5)


def test_kimi_k2s_config_name_is_deepseek_v3_and_checkpoints_say_so(tmp_path: Any) -> None:
    """Kimi K2 ships DeepSeek-V3's architecture as ``model_type`` kimi_k2 with remote code in
    ``auto_map`` (transformers itself reads kimi_k2 as deepseek_v3): it runs as DeepSeek-V3,
    and a checkpoint pivotflow writes is a DeepseekV3ForCausalLM transformers loads without the
    remote code, to the same logits."""
    import json
    import sys
    from pathlib import Path

    import torch
    import transformers

    sys.path.insert(0, str(Path(__file__).parent))
    from hf_fixtures import DEEPSEEK_V3 as CASE
    from hf_fixtures import PROMPTS, save_folder

    from pivotflow.engines.torch.model import Decoder
    from pivotflow.engines.torch.weights import load_model_folder, save_checkpoint

    model = save_folder(CASE, tmp_path / "v3")
    reference = load_model_folder(tmp_path / "v3")
    config = json.loads((tmp_path / "v3" / "config.json").read_text())
    config.update(model_type="kimi_k2", auto_map={
        "AutoConfig": "configuration_deepseek.DeepseekV3Config",
        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"})
    (tmp_path / "v3" / "config.json").write_text(json.dumps(config))
    kimi = load_model_folder(tmp_path / "v3")
    assert kimi.config == reference.config
    assert kimi.hf_config["model_type"] == "deepseek_v3" and "auto_map" not in kimi.hf_config
    save_checkpoint(tmp_path / "written", kimi.hf_config, kimi.tensors)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "written").eval()
    assert type(again).__name__ == "DeepseekV3ForCausalLM"
    ids = torch.tensor([PROMPTS[2] * 4])
    ours = Decoder(kimi.config)
    ours.load_state_dict(kimi.tensors, strict=False)
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(ours.eval()(ids), model(ids).logits, atol=1e-5, rtol=0)


def test_a_kimi_k25_folder_runs_its_text_model(tmp_path: Any) -> None:
    """Kimi K2.5 wraps Kimi K2's text model (``text_config`` kimi_k2, its tensors under
    ``language_model.``, as the Hub's files name them) with a vision tower: pivotflow holds the
    text model as DeepSeek-V3 (its router said as DeepSeek-V3's, for vLLM), to that model's
    logits; an INT4 quantization the wrapper names (K2.5's, compressed-tensors) is refused in
    one line, not read as floats."""
    import json
    import sys
    from pathlib import Path

    import torch
    from safetensors.torch import load_file, save_file

    sys.path.insert(0, str(Path(__file__).parent))
    from hf_fixtures import DEEPSEEK_V3 as CASE
    from hf_fixtures import PROMPTS, save_folder

    from pivotflow.engines.torch.model import Decoder
    from pivotflow.engines.torch.weights import load_model_folder

    text_model = save_folder(CASE, tmp_path / "text")
    text = json.loads((tmp_path / "text" / "config.json").read_text())
    tensors = {("language_model." + n if n.startswith(("model.", "lm_head.")) else n): t
               for n, t in load_file(tmp_path / "text" / "model.safetensors").items()}
    tensors["vision_tower.encoder.blocks.0.norm0.weight"] = torch.ones(32)
    tensors["mm_projector.proj.0.weight"] = torch.ones(64, 32)
    (tmp_path / "k25").mkdir()
    save_file(tensors, tmp_path / "k25" / "model.safetensors", metadata={"format": "pt"})
    wrapper = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
               "text_config": {**text, "model_type": "kimi_k2"},
               "vision_config": {"patch_size": 14, "hidden_size": 32}}
    (tmp_path / "k25" / "config.json").write_text(json.dumps(wrapper))
    folder = load_model_folder(tmp_path / "k25")
    assert folder.hf_config["model_type"] == "deepseek_v3"
    assert folder.hf_config["topk_method"] == "noaux_tc"  # (DeepSeek-V3's router, for vLLM)
    assert folder.config == load_model_folder(tmp_path / "text").config
    assert not any("vision" in n or "projector" in n for n in folder.tensors)
    ids = torch.tensor([PROMPTS[2] * 4])
    ours = Decoder(folder.config)
    ours.load_state_dict(folder.tensors, strict=False)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(ids), text_model(ids).logits, atol=1e-5, rtol=0)
    wrapper["quantization_config"] = {"quant_method": "compressed-tensors",
                                      "format": "pack-quantized"}
    (tmp_path / "k25" / "config.json").write_text(json.dumps(wrapper))
    with pytest.raises(ModelConfigError) as err:
        load_model_folder(tmp_path / "k25")
    assert "quantization_config=" in str(err.value) and "\n" not in str(err.value)
