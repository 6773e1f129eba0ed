"""Bring your own model: a Qwen2 that transformers saved, next to a BPE tokenizer trained here,
named in a graph by its path, run by ``pivotflow run`` in its own process on chat-message
prompts; and every bad input a newcomer may bring is one line naming the file and the key."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hf_folders import IM_END, save_tokenizer_hf, train_bpe

from pivotflow.errors import GraphError
from pivotflow.tasks.datasets import load_prompt_file

pytestmark = pytest.mark.timeout(600)

GRAPH = '''
from pivotflow.graph import Graph
from pivotflow.rl.group_fns import grpo_advantage
from pivotflow.tasks.arithmetic import check_answer
from pivotflow.tokenizer import load_tokenizer

MODEL = %(model)r
TOK = load_tokenizer(MODEL)


def reward(prompt, prompt_ids, answer, completion, **_):
    # the row's messages, rendered by the model's chat template: checked inside the run itself
    if prompt_ids != TOK.encode(TOK.apply_chat_template(prompt, add_generation_prompt=True)):
        raise ValueError("the prompt was not rendered with the chat template")
    # the exact rule, and shorter is better: a random model is never right, and a reward that
    # never varies gives GRPO nothing to train on
    return float(check_answer(answer, completion)) - len(completion) / 100


def build(config):
    g = Graph("byo")
    g.model("policy", source=MODEL)
    g.pool("rollout", workers=1)
    g.pool("trainer", workers=1)
    src = g.source("prompts", path=%(prompts)r, group_size=4, groups_per_step=2,
                   check_with="arithmetic")
    gen = g.generate("rollout", model="policy", pool="rollout", max_tokens=8%(generate)s)
    rew = g.map("reward", reward, writes=["reward"])
    adv = g.group("advantage", grpo_advantage, writes=["advantage"])
    g.chain(src, gen, rew, adv, g.train("train", model="policy", pool="trainer", lr=1e-3%(train)s))
    return g
'''


def save_qwen2(folder: Path, vocab_size: int, seed: int = 0) -> None:
    """A random-weight Qwen2 (hidden 64, head_dim 32, 2 layers) as transformers saves one, with
    a generation_config whose stop tokens are ``<|im_end|>`` and EOS, as Qwen's instruct
    models have them."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=32, max_position_embeddings=256, tie_word_embeddings=True,
                      eos_token_id=0, bos_token_id=None, pad_token_id=0)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config = GenerationConfig(eos_token_id=[2, 0], pad_token_id=0)
    model.save_pretrained(folder)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("qwen2")
    bpe = train_bpe()
    assert bpe.token_to_id(IM_END) == 2
    save_qwen2(folder, save_tokenizer_hf(bpe, folder))
    return folder


def write_prompts(path: Path, rows: list[object] | None = None) -> Path:
    rows = rows or [{"prompt": [{"role": "system", "content": "Add."},
                                {"role": "user", "content": f"{a}+{b}="}], "answer": a + b}
                    for a in range(10, 14) for b in range(20, 23)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_graph(tmp: Path, model: Path, prompts: Path, generate: str = "",
                train: str = "") -> Path:
    """The graph on ``model``; ``generate``, ``train``: more arguments of those stages."""
    graph = tmp / "graph.py"
    graph.write_text(GRAPH % {"model": str(model), "prompts": str(prompts),
                              "generate": generate and f", {generate}",
                              "train": train and f", {train}"})
    return graph


def cli(*args: str, timeout: float = 500) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pivotflow.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_a_transformers_qwen2_runs_on_message_prompts_and_its_checkpoint_loads_back(
        tmp_path: Path, qwen: Path) -> None:
    graph = write_graph(tmp_path, qwen, write_prompts(tmp_path / "prompts.jsonl"))
    out = tmp_path / "out"
    done = cli("run", str(graph), "--out", str(out), "--steps", "3", "--set", "live=false")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["error"] is None
    assert summary["ledger"]["groups_trained"] == 6
    assert summary["ledger"]["lost"] == 0 and summary["ledger"]["duplicates"] == 0

    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt = out / "checkpoints" / "policy"
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.head_dim == 32 and model.config.vocab_size == len(tok)
    messages = [{"role": "user", "content": "12+34="}]
    original = AutoTokenizer.from_pretrained(qwen)
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        original.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert json.loads((ckpt / "generation_config.json").read_text())["eos_token_id"] == [2, 0]
    # trained: the weights moved from the folder's
    import torch
    from safetensors.torch import load_file

    before, after = load_file(qwen / "model.safetensors"), load_file(ckpt / "model.safetensors")
    assert not torch.equal(before["model.layers.0.mlp.up_proj.weight"],
                           after["model.layers.0.mlp.up_proj.weight"])
    ids = tok("12+34=", return_tensors="pt").input_ids
    assert model(ids).logits.shape == (1, ids.shape[1], len(tok))


def test_a_transformers_qwen3_moe_trains_and_its_checkpoint_loads_back(
        tmp_path: Path, qwen: Path) -> None:
    """A mixture-of-experts policy (Qwen3-MoE: 4 experts, 2 per token) in the same run, in the
    controller's process, with routing replay and a load-balancing loss: generated, trained on
    its rollouts' experts, and written back in the Hub's per-expert names, which transformers
    reads; its router and experts moved. The same graph on the dense Qwen2 is one line: it has
    no experts."""
    import torch
    from safetensors.torch import load_file
    from transformers import (
        AutoModelForCausalLM,
        GenerationConfig,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    from pivotflow.run import run

    moe = copy_model(qwen, tmp_path / "moe", skip=("model.safetensors", "config.json"))
    torch.manual_seed(0)
    policy = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=json.loads((qwen / "config.json").read_text())["vocab_size"],
        hidden_size=64, intermediate_size=128, moe_intermediate_size=64, num_experts=4,
        num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
        eos_token_id=0, pad_token_id=0))
    policy.generation_config = GenerationConfig(eos_token_id=[2, 0], pad_token_id=0)
    policy.save_pretrained(moe)
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    graph = write_graph(tmp_path, moe, prompts, "routing_replay=True",
                        "router_aux_loss_coef=0.01")
    result = run(graph, steps=2, out=tmp_path / "out", console=False, sets=["live=false"])
    s = result.summary
    assert s["error"] is None and s["steps"] == 2 and s["ledger"]["groups_trained"] == 4
    assert s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    # float32 rollouts and training, the routing replayed: the trainer's first forward gives
    # the rollout's logprobs to float rounding on the tokens its weights sampled
    from pivotflow.metrics import read_metrics

    gaps = [r["train_rollout_logprob_gap"] for r in read_metrics(tmp_path / "out" / "metrics.jsonl")
            if "train_rollout_logprob_gap" in r]
    assert gaps and max(gaps) < 1e-4, gaps
    # E * sum_e f_e P_e of 4 experts, 2 a token: 2 when balanced, at most 8
    balance = [r["train_router_aux_loss"] for r in read_metrics(tmp_path / "out" / "metrics.jsonl")
               if "train_router_aux_loss" in r]
    assert len(balance) == 2 and all(1.0 < b < 8.0 for b in balance), balance
    ckpt = tmp_path / "out" / "checkpoints" / "policy"
    theirs, info = AutoModelForCausalLM.from_pretrained(ckpt, output_loading_info=True)
    assert type(theirs).__name__ == "Qwen3MoeForCausalLM" and not info["missing_keys"]
    before, after = load_file(moe / "model.safetensors"), load_file(ckpt / "model.safetensors")
    for name in ("model.layers.0.mlp.gate.weight", "model.layers.1.mlp.experts.0.up_proj.weight",
                 "model.layers.1.mlp.experts.3.down_proj.weight"):
        assert not torch.equal(before[name], after[name]), name
    # resumed from its checkpoint (the policy's experts and their AdamW state) for one more step
    again = run(graph, steps=3, out=tmp_path / "out", console=False, resume=str(tmp_path / "out"))
    assert again.summary["steps"] == 3 and again.summary["error"] is None
    assert again.summary["ledger"]["lost"] == 0 and again.summary["ledger"]["duplicates"] == 0
    dense = write_graph(tmp_path / "out", qwen, prompts, "routing_replay=True")
    with pytest.raises(GraphError, match=r"generate 'rollout' at .*graph.py:\d+: routing_replay "
                       r"needs a mixture-of-experts model; 'policy' \(.*config.json\) is a "
                       r"dense qwen2$"):
        run(dense, steps=1, out=tmp_path / "dense", console=False, sets=["live=false"])
    dense = write_graph(tmp_path / "out", qwen, prompts, train="router_aux_loss_coef=0.01")
    with pytest.raises(GraphError, match=r"train 'train' at .*graph.py:\d+: router_aux_loss_coef "
                       r"needs a mixture-of-experts model; 'policy' \(.*config.json\) is a "
                       r"dense qwen2$"):
        run(dense, steps=1, out=tmp_path / "dense", console=False, sets=["live=false"])
    # LoRA on every expert's gate, up and down too (the default targets): the adapter names
    # each expert's projections, as pivotflow holds them; PEFT 0.21 reads those names onto
    # transformers 5's stacked experts (its v4-to-v5 conversion) and merges to the policy
    from safetensors.torch import load_file as load_adapter
    from test_lora_run import peft_merges_to_the_policy

    from pivotflow import checkpoints

    lora = write_graph(tmp_path / "out", moe, prompts, train="lora_rank=4")
    done = run(lora, steps=2, out=tmp_path / "lora", console=False,
               sets=["live=false", "checkpoint_every=2"])
    assert done.summary["error"] is None
    latest = checkpoints.latest(tmp_path / "lora")
    assert latest is not None
    exported = load_adapter(latest / "adapter" / "adapter_model.safetensors")
    assert "base_model.model.model.layers.1.mlp.experts.3.down_proj.lora_B.weight" in exported
    peft_merges_to_the_policy(latest)


# Families whose files lay tensors out otherwise than pivotflow holds them (params/hf_layout.py):
# (transformers' config and model classes, extra config keys, two tensors training must move)
OTHER_LAYOUTS = {
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"bos_token_id": 1},
             ("model.layers.0.self_attn.qkv_proj.weight", "model.layers.1.mlp.gate_up_proj.weight")),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                {"num_local_experts": 4, "num_experts_per_tok": 2},
                ("model.layers.0.block_sparse_moe.gate.weight",
                 "model.layers.1.block_sparse_moe.experts.2.w3.weight")),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", {"head_dim": 32},
             ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.post_mlp_layernorm.weight")),
    # GLM-4.5: a dense layer, then a sparse one (4 experts in 2 groups, a sigmoid router, a
    # shared expert); its file carries a multi-token-prediction layer the run leaves out
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM",
                 {"head_dim": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 64, "n_group": 2, "topk_group": 1,
                  "routed_scaling_factor": 2.5, "attention_bias": True},
                 ("model.layers.1.mlp.gate.weight",
                  "model.layers.1.mlp.shared_experts.up_proj.weight")),
    # gpt-oss: its router and fused, input-major expert stacks (held one expert at a time),
    # attention sinks
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                {"head_dim": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
                 "sliding_window": 8},
                ("model.layers.0.mlp.router.weight", "model.layers.1.mlp.experts.gate_up_proj",
                 "model.layers.0.self_attn.sinks")),
    # DeepSeek-V3: latent attention (queries through a latent, values narrower than keys,
    # interleaved rotary pairs), then GLM-4.5's experts; a multi-token-prediction layer too
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    {"num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 32,
                     "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 24,
                     "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                     "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5,
                     "first_k_dense_replace": 1},
                    ("model.layers.0.self_attn.kv_b_proj.weight",
                     "model.layers.1.self_attn.q_a_layernorm.weight",
                     "model.layers.1.mlp.gate.weight")),
    # Qwen3.5: a gated DeltaNet layer (its state kept per sequence by the engine), then gated
    # full attention
    "qwen3_5_text": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
                     {"head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                      "linear_key_head_dim": 32, "linear_value_head_dim": 32,
                      "layer_types": ["linear_attention", "full_attention"]},
                     ("model.layers.0.linear_attn.in_proj_qkv.weight",
                      "model.layers.0.linear_attn.A_log", "model.layers.0.linear_attn.conv1d.weight",
                      "model.layers.1.self_attn.q_proj.weight")),
    # Qwen3.5-MoE: the same, every layer's MLP 4 routed experts (2 a token) and a gated shared
    # expert
    "qwen3_5_moe_text": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM",
                         {"head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                          "linear_key_head_dim": 32, "linear_value_head_dim": 32,
                          "layer_types": ["linear_attention", "full_attention"],
                          "num_experts": 4, "num_experts_per_tok": 2,
                          "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64},
                         ("model.layers.0.linear_attn.in_proj_z.weight",
                          "model.layers.1.mlp.gate.weight",
                          "model.layers.1.mlp.shared_expert_gate.weight")),
    # Qwen3-Next: the same hybrid, its DeltaNet projections fused and grouped by key head in
    # the file (in_proj_qkvz, in_proj_ba); a dense layer, then a sparse one
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                   {"head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                    "linear_key_head_dim": 32, "linear_value_head_dim": 32,
                    "layer_types": ["linear_attention", "full_attention"], "num_experts": 4,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                    "shared_expert_intermediate_size": 64, "decoder_sparse_step": 2},
                   ("model.layers.0.linear_attn.in_proj_qkvz.weight",
                    "model.layers.0.linear_attn.in_proj_ba.weight",
                    "model.layers.1.mlp.experts.1.up_proj.weight")),
    # Granite 4.0-H-Micro's kind: a Mamba2 layer (its state kept per sequence by the engine),
    # then attention without rope; each layer's MLP dense, its gate and up fused in the file;
    # Granite's multipliers (its experts' layout: test_families_and_windows, where transformers
    # loads the checkpoints pivotflow writes)
    "granitemoehybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
                         {"layer_types": ["mamba", "attention"], "mamba_n_heads": 8,
                          "mamba_d_head": 32, "mamba_n_groups": 1, "mamba_d_state": 32,
                          "num_local_experts": 0, "shared_intermediate_size": 64,
                          "position_embedding_type": "nope", "embedding_multiplier": 12.0,
                          "residual_multiplier": 0.22, "attention_multiplier": 0.03,
                          "logits_scaling": 6.0},
                         ("model.layers.0.mamba.in_proj.weight", "model.layers.0.mamba.A_log",
                          "model.layers.0.mamba.conv1d.weight",
                          "model.layers.1.shared_mlp.output_linear.weight",
                          "model.layers.1.shared_mlp.input_linear.weight")),
    # OLMo Hybrid: a gated DeltaNet layer writing at up to twice the rate (its projections and
    # convolutions apart in the file), then OLMo-3's post-norm attention without rope
    "olmo_hybrid": ("OlmoHybridConfig", "OlmoHybridForCausalLM",
                    {"head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                     "linear_key_head_dim": 32, "linear_value_head_dim": 32,
                     "layer_types": ["linear_attention", "full_attention"],
                     "rope_parameters": {"rope_type": "default", "rope_theta": None}},
                    ("model.layers.0.linear_attn.q_proj.weight",
                     "model.layers.0.linear_attn.q_conv1d.weight",
                     "model.layers.0.linear_attn.g_proj.weight",
                     "model.layers.1.self_attn.q_norm.weight")),
    # LFM2: a gated short convolution (its inputs kept per sequence), then attention with
    # per-head q/k norms; its own names for norms, attention output and MLP
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM",
             {"layer_types": ["conv", "full_attention"], "block_multiple_of": 32},
             ("model.layers.0.conv.in_proj.weight", "model.layers.0.conv.conv.weight",
              "model.layers.1.self_attn.out_proj.weight", "model.layers.1.feed_forward.w1.weight",
              "model.layers.1.self_attn.q_layernorm.weight")),
    # MiniMax-M2: whole-projection q/k norms, half of each head rotating, 4 experts on every
    # layer by a sigmoid router with a correction bias on the sparse block; Mixtral's names
    "minimax_m2": ("MiniMaxM2Config", "MiniMaxM2ForCausalLM",
                   {"head_dim": 32, "rotary_dim": 16, "num_local_experts": 4,
                    "num_experts_per_tok": 2},
                   ("model.layers.0.block_sparse_moe.experts.1.w1.weight",
                    "model.layers.1.block_sparse_moe.gate.weight",
                    "model.layers.0.self_attn.q_norm.weight")),
    # Nemotron-H: one block a layer (Mamba2, an ungated relu^2 MLP, attention without rope,
    # another MLP), its decoder named backbone and each block mixer in the file
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM",
                   {"hybrid_override_pattern": "M-*-", "head_dim": 32, "mamba_num_heads": 8,
                    "mamba_head_dim": 32, "n_groups": 2, "ssm_state_size": 32},
                   ("backbone.layers.0.mixer.in_proj.weight", "backbone.layers.0.mixer.A_log",
                    "backbone.layers.1.mixer.up_proj.weight",
                    "backbone.layers.2.mixer.q_proj.weight", "backbone.embeddings.weight")),
    # ERNIE 4.5 MoE: interleaved rotary pairs (held turned), a dense layer then 4 experts
    # chosen by a softmax plus a correction bias kept on moe_statics in the file (frozen)
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM",
                     {"head_dim": 32, "moe_num_experts": 4, "moe_k": 2,
                      "moe_intermediate_size": 64, "moe_num_shared_experts": 1,
                      "moe_layer_start_index": 1},
                     ("model.layers.0.self_attn.q_proj.weight",
                      "model.layers.1.mlp.gate.weight",
                      "model.layers.1.mlp.shared_experts.up_proj.weight")),
    # LFM2-MoE: LFM2's layers, a dense first MLP, then 4 experts under LFM2's names by a
    # sigmoid router with its correction bias on the block (frozen)
    "lfm2_moe": ("Lfm2MoeConfig", "Lfm2MoeForCausalLM",
                 {"layer_types": ["conv", "full_attention"], "moe_intermediate_size": 64,
                  "num_dense_layers": 1, "num_experts": 4, "num_experts_per_tok": 2},
                 ("model.layers.0.conv.in_proj.weight", "model.layers.1.feed_forward.gate.weight",
                  "model.layers.1.feed_forward.experts.2.w1.weight")),
    # Hunyuan-MoE: q/k normalised per head after rope (query_layernorm/key_layernorm in the
    # file), a shared MLP (shared_mlp) beside 4 experts on every layer, its router gate.wg
    "hunyuan_v1_moe": ("HunYuanMoEV1Config", "HunYuanMoEV1ForCausalLM",
                       {"head_dim": 32, "num_experts": 4, "moe_topk": 2},
                       ("model.layers.0.self_attn.query_layernorm.weight",
                        "model.layers.1.mlp.gate.wg.weight",
                        "model.layers.0.mlp.shared_mlp.up_proj.weight",
                        "model.layers.1.mlp.experts.3.down_proj.weight")),
    # AFMoE (Arcee Trinity): Gemma's sandwich layer, attention gated by a projection of its own
    # (held inside q_proj), rope on the sliding layers only; a dense layer, then 4 experts by a
    # sigmoid router with its correction bias on the block (frozen); its own names for the
    # router and MLP norms
    "afmoe": ("AfmoeConfig", "AfmoeForCausalLM",
              {"head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2,
               "num_shared_experts": 1, "moe_intermediate_size": 64, "num_dense_layers": 1,
               "global_attn_every_n_layers": 2, "sliding_window": 8},
              ("model.layers.0.self_attn.gate_proj.weight", "model.layers.1.mlp.router.gate.weight",
               "model.layers.1.pre_mlp_layernorm.weight")),
    # HY V3: per-head q/k norms, a dense layer then 4 experts by a sigmoid router with its
    # correction bias on the block (frozen), a shared MLP; its own names for those
    "hy_v3": ("HYV3Config", "HYV3ForCausalLM",
              {"head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2,
               "moe_intermediate_size": 64},
              ("model.layers.1.mlp.router.gate.weight", "model.layers.1.mlp.shared_mlp.up_proj.weight",
               "model.layers.1.mlp.experts.2.down_proj.weight")),
    # MiniCPM5-MoE: attention gated by a sigmoid (q and gate by head in q_proj, as Qwen3.5's),
    # a dense layer, then 4 experts by a grouped sigmoid router with its correction bias
    # (frozen), a shared one
    "minicpm5_moe": ("MiniCPM5MoeConfig", "MiniCPM5MoeForCausalLM",
                     {"head_dim": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
                      "moe_intermediate_size": 64, "n_group": 2, "topk_group": 1},
                     ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.gate.weight",
                      "model.layers.1.mlp.shared_experts.up_proj.weight")),
    # Apertus: its norms under names of its own, an ungated MLP through xIELU whose two learned
    # scalars a layer train (its constants, buffers in transformers, stay as they were)
    "apertus": ("ApertusConfig", "ApertusForCausalLM", {"head_dim": 32},
                ("model.layers.0.attention_layernorm.weight", "model.layers.1.mlp.act_fn.alpha_p",
                 "model.layers.1.mlp.act_fn.alpha_n")),
    # Mistral 4: DeepSeek-V3's latent attention and layer, a softmax router over 2 groups,
    # Llama 4's query scaling past 16 positions; its experts stacked in the file, output-major
    # (the gate/up stack square here: [4, 128, 128]); transformers' auto classes map no causal
    # LM for it (the Hub holds it inside Mistral3ForConditionalGeneration)
    "mistral4": ("Mistral4Config", "Mistral4ForCausalLM",
                 {"num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 32,
                  "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 24,
                  "n_routed_experts": 4,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 64, "n_group": 2,
                  "topk_group": 1, "first_k_dense_replace": 1, "rope_parameters": {
                      "type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                      "original_max_position_embeddings": 16, "mscale": 1.0,
                      "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}},
                 ("model.layers.0.self_attn.kv_b_proj.weight",
                  "model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.gate.weight")),
    # Cohere 2 (Command R7B's kind): parallel layers with LayerNorms, rope in interleaved pairs
    # (held reordered) on its sliding layer, NoPE on its full one, logits times 0.25
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM",
                {"sliding_window": 8, "sliding_window_pattern": 2, "logit_scale": 0.25},
                ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.up_proj.weight",
                 "model.layers.1.input_layernorm.weight")),
    # Granite 3's MoE (granite-3.1-1b-a400m's kind): Granite's multipliers, every layer's 4
    # experts (2 a token) stacked in the file with gate and up fused
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM",
                   {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 64,
                    "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                    "attention_multiplier": 0.03, "logits_scaling": 6.0},
                   ("model.layers.0.block_sparse_moe.router.layer.weight",
                    "model.layers.1.block_sparse_moe.input_linear.weight",
                    "model.layers.1.block_sparse_moe.output_linear.weight")),
    # gemma-4-26B-A4B's kind (text-only, as a Gemma4ForCausalLM): a sliding then a full layer
    # (heads twice as wide on one kv head, values equal to keys), 4 experts (2 a token) beside
    # each MLP, its router and stacked experts on the layer in the file
    "gemma4_text": ("Gemma4TextConfig", "Gemma4ForCausalLM",
                    {"head_dim": 32, "global_head_dim": 64, "num_global_key_value_heads": 1,
                     "attention_k_eq_v": True, "hidden_size_per_layer_input": 0,
                     "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"],
                     "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2,
                     "moe_intermediate_size": 64},
                    ("model.layers.0.router.proj.weight", "model.layers.1.experts.gate_up_proj",
                     "model.layers.1.router.per_expert_scale",
                     "model.layers.1.self_attn.k_proj.weight")),
    # Llama 4 (Scout's kind, two layers): the first turns interleaved pairs (held reordered)
    # within chunks of 8 with weightless q/k norms and a dense MLP, the second turns no
    # position (its queries' temperature from position 3) and routes each token to 1 of 4
    # experts, stacked input-major in the file, beside a shared expert
    "llama4_text": ("Llama4TextConfig", "Llama4ForCausalLM",
                    {"head_dim": 32, "intermediate_size": 64, "intermediate_size_mlp": 128,
                     "num_local_experts": 4, "num_experts_per_tok": 1,
                     "interleave_moe_layer_step": 2, "no_rope_layers": [1, 0],
                     "attention_chunk_size": 8, "floor_scale": 4, "attn_scale": 0.5},
                    ("model.layers.0.self_attn.q_proj.weight",
                     "model.layers.0.feed_forward.up_proj.weight",
                     "model.layers.1.feed_forward.experts.gate_up_proj",
                     "model.layers.1.feed_forward.router.weight",
                     "model.layers.1.feed_forward.shared_expert.down_proj.weight")),
}
# a GLM-4.5 file's multi-token-prediction layer (layer 2 of a 2-layer decoder), as the Hub's
# checkpoints hold one past their last layer
MTP_LAYER = {"model.layers.2.eh_proj.weight": (128, 256), "model.layers.2.enorm.weight": (128,),
             "model.layers.2.shared_head.norm.weight": (128,)}
# what a LoRA run's PEFT adapter targets, and the fused modules' ranks (4 a part)
LORA_EXPORTS = {
    "phi3": (["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
             {"qkv_proj": 12, "gate_up_proj": 8}),
    "glm4": (["q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"],
             {"gate_up_proj": 8}),
    # (Qwen3.5's gated DeltaNet projections named too: defaults.LORA_LINEAR_ATTENTION_TARGETS)
    "qwen3_5_text": (["q_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
                      "out_proj", "down_proj"], {}),
    # (Qwen3-Next's: onto its fused, grouped in_proj_qkvz and in_proj_ba, rank 8 each; not
    # its MLPs: PEFT leaves a down_proj adapter unmerged where the model holds experts fused)
    "qwen3_next": (["q_proj", "o_proj", "in_proj_qkvz", "in_proj_ba", "out_proj"],
                   {"in_proj_qkvz": 8, "in_proj_ba": 8}),
    # (Granite 4.0's shared MLP: gate/up onto its fused input_linear, rank 8, down onto
    # output_linear; Mamba2's in_proj and out_proj named too)
    "granitemoehybrid": (["q_proj", "o_proj", "in_proj", "out_proj", "input_linear",
                          "output_linear"], {"input_linear": 8}),
    # (LFM2's: its attention output and MLP under its names; its convolutions' in/out too)
    "lfm2": (["q_proj", "out_proj", "in_proj", "w1", "w3", "w2"], {}),
    # (OLMo Hybrid's DeltaNet: q/k/v apart, the rest under its names)
    "olmo_hybrid": (["q_proj", "k_proj", "v_proj", "o_proj", "a_proj", "b_proj", "g_proj",
                     "down_proj"], {}),
    # (Nemotron-H's blocks under transformers' mixer names: nothing fused; not Mamba2's
    # out_proj, which PEFT refuses on nemotron_h: its fused kernel reads the weight whole)
    "nemotron_h": (["q_proj", "o_proj", "in_proj", "up_proj", "down_proj"], {}),
    # (Hunyuan-MoE's attention: PEFT maps any down_proj target onto experts it holds fused)
    "hunyuan_v1_moe": (["q_proj", "k_proj", "v_proj", "o_proj"], {}),
    # (HY V3's attention and shared MLP, its name in the file: not its experts, which PEFT
    # maps a gate_proj target onto, held fused there)
    "hy_v3": (["q_proj", "k_proj", "v_proj", "o_proj"], {}),
    # (AFMoE's k, v and o: PEFT reads any gate_proj target as its fused experts', so an adapter
    # of the held q_proj, which exports as q_proj's and self_attn.gate_proj's, does not load
    # there: test_hub_folders checks that export)
    "afmoe": (["k_proj", "v_proj", "o_proj"], {}),
    # (Cohere 2's: q's and k's B rows back in its interleaved order)
    "cohere2": (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                {}),
    # (Gemma 4's attention: v_proj on its sliding layers only; not its MLP, beside experts
    # PEFT holds fused)
    "gemma4_text": (["q_proj", "k_proj", "v_proj", "o_proj"], {}),
    # (Llama 4's attention, q's and k's B rows back in its interleaved order)
    "llama4_text": (["q_proj", "k_proj", "v_proj", "o_proj"], {}),
}


@pytest.mark.parametrize("family", list(OTHER_LAYOUTS))
def test_a_family_laid_out_otherwise_on_disk_trains_and_its_checkpoint_loads_back(
        tmp_path: Path, qwen: Path, family: str) -> None:
    """Phi-3/Phi-4's file fuses q/k/v (qkv_proj) and gate/up (gate_up_proj); Mixtral's names
    its sparse layer block_sparse_moe and its experts' projections w1/w2/w3; GLM-4.5's holds
    a multi-token-prediction layer past the decoder's (left out; its sigmoid router's
    correction bias stays as it was, its rollouts' experts replayed), as DeepSeek-V3's does
    behind latent attention; Qwen3.5's holds a gated DeltaNet layer. The run holds
    pivotflow's layout, its rollouts' logprobs equal its trainer's, and the checkpoint it writes
    is the family's own file again, trained, that resumes. A LoRA run (phi3 and glm4: adapters
    of the fused projections; Qwen3.5 with its DeltaNet projections named) exports adapters
    that PEFT merges to its policy."""
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, GenerationConfig

    from pivotflow.metrics import read_metrics
    from pivotflow.run import run

    config_class, model_class, extra, moved = OTHER_LAYOUTS[family]
    folder = copy_model(qwen, tmp_path / family, skip=("model.safetensors", "config.json"))
    torch.manual_seed(0)
    policy = getattr(transformers, model_class)(getattr(transformers, config_class)(**{
        "vocab_size": json.loads((qwen / "config.json").read_text())["vocab_size"],
        "hidden_size": 128, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "eos_token_id": 0, "pad_token_id": 0, **extra}))
    policy.generation_config = GenerationConfig(eos_token_id=[2, 0], pad_token_id=0)
    policy.save_pretrained(folder)
    mtp = family in ("glm4_moe", "deepseek_v3")
    # (a router's correction bias, frozen: the sigmoid ones' and ERNIE 4.5 MoE's)
    sigmoid = mtp or family in ("minimax_m2", "ernie4_5_moe", "lfm2_moe", "afmoe", "hy_v3",
                                "minicpm5_moe")
    # (Gemma 4's and Granite 3's experts' routing replayed too)
    replayed = sigmoid or family in ("gemma4_text", "granitemoe", "llama4_text")
    if mtp:
        from safetensors.torch import save_file

        with_mtp = load_file(folder / "model.safetensors")
        with_mtp.update({name: torch.ones(shape) for name, shape in MTP_LAYER.items()})
        save_file(with_mtp, str(folder / "model.safetensors"), metadata={"format": "pt"})
    said = cli("model", str(folder))
    assert said.returncode == 0 and f"{folder}: {family}, " in said.stderr, said.stderr
    assert {"phi3": "tensors: q/k/v and gate/up fused in the file, held split",
            "mixtral": "experts 4 (2 a token) on 2 of 2 layers",
            "glm4": "16 of 32 dimensions turn",
            "glm4_moe": "experts 4 (2 a token) on 1 of 2 layers; sigmoid router with a "
                        "correction bias, from the best 1 of 2 groups, weights times 2.5, 1 "
                        "shared\n  tensors: 1 multi-token-prediction layer(s) in the file, not "
                        "loaded",
            "deepseek_v3": "latent attention: keys and values from a 32 latent, queries from "
                           "a 32 latent; values 24 wide\n  experts 4 (2 a token) on 1 of 2 "
                           "layers; sigmoid router with a correction bias, from the best 1 of 2 "
                           "groups, weights times 2.5, 1 shared\n  tensors: 1 "
                           "multi-token-prediction layer(s) in the file, not loaded",
            "gpt_oss": "tensors: router and experts fused in the file, held one expert at a "
                       "time",
            "qwen3_5_text": "linear attention (gated DeltaNet) on 1 of 2 layers: 4 value heads "
                            "of 32 on 2 key heads of 32, a 4-tap convolution; the others' "
                            "attention output gated",
            "qwen3_5_moe_text": "the others' attention output gated\n  experts 4 (2 a token) on "
                                "2 of 2 layers",
            "granitemoehybrid": "Mamba2 on 1 of 2 layers: 8 heads of 32, state 32 in 1 "
                                "group(s), a 4-tap convolution\n  tensors: shared MLP's "
                                "gate/up fused in the file, held split",
            "olmo_hybrid": "linear attention (gated DeltaNet) on 1 of 2 layers: 4 value heads of "
                           "32 on 2 key heads of 32, a 4-tap convolution; writes at up to "
                           "twice the rate\n  tensors: DeltaNet projections and convolutions "
                           "apart in the file, held stacked as Qwen3.5's",
            "lfm2": "gated short convolutions on 1 of 2 layers: 3 taps\n  tensors: norms, "
                    "attention output and MLP under LFM2's names in the file, held under the "
                    "common ones",
            "minimax_m2": "experts 4 (2 a token) on 2 of 2 layers; sigmoid router with a "
                          "correction bias\n  tensors: block_sparse_moe and w1/w2/w3 in the "
                          "file, held as mlp.experts",
            "nemotron_h": "Mamba2 on 1 of 4 layers: 8 heads of 32, state 32 in 2 group(s), a "
                          "4-tap convolution\n  one block a layer: 1 Mamba2, 1 attention, 2 "
                          "MLP (ungated, relu^2)\n  tensors: backbone.* and each block's mixer "
                          "in the file, held under the common names",
            "ernie4_5_moe": "experts 4 (2 a token) on 1 of 2 layers; softmax router with a "
                            "correction bias, 1 shared\n  tensors: rotary pairs interleaved in "
                            "the file, q/k rows held reordered; its router's correction bias as "
                            "moe_statics, held on the router",
            "lfm2_moe": "experts 4 (2 a token) on 1 of 2 layers; sigmoid router with a "
                        "correction bias\n  tensors: norms, attention output, MLP and experts "
                        "under LFM2's names in the file, held under the common ones",
            "hunyuan_v1_moe": "experts 4 (2 a token) on 2 of 2 layers; 1 shared\n  tensors: q/k "
                              "norms, router and shared MLP as query_layernorm/key_layernorm, "
                              "gate.wg and shared_mlp in the file, held as q_norm/k_norm, gate "
                              "and shared_experts",
            "hy_v3": "experts 4 (2 a token) on 1 of 2 layers; sigmoid router with a "
                     "correction bias, weights times 2.826, 1 shared\n  tensors: router, its "
                     "correction bias and shared MLP as mlp.router.gate, mlp.expert_bias and "
                     "mlp.shared_mlp in the file, held as mlp.gate (the bias on it) and "
                     "mlp.shared_experts",
            "minicpm5_moe": "attention output gated by a sigmoid\n  experts 4 (2 a token) on "
                            "1 of 2 layers; sigmoid router with a correction bias, from the "
                            "best 1 of 2 groups, weights times 3.66, 1 shared",
            "apertus": "tensors: norms as attention_layernorm/feedforward_layernorm in the "
                       "file, held as input_layernorm/post_attention_layernorm",
            "afmoe": "attention output gated by a sigmoid\n  sliding "
                     "window 8 on 1 of 2 layers\n  experts 4 (2 a token) on 1 of 2 layers; "
                     "sigmoid router with a correction bias, 1 shared\n  tensors: attention's "
                     "gate_proj, router and MLP norms under AFMoE's names in the file, held "
                     "inside q_proj and under the common ones",
            "mistral4": "experts 4 (2 a token) on 1 of 2 layers; from the best 1 of 2 groups, "
                        "1 shared\n  tensors: experts stacked in the file (gate_up_proj, "
                        "down_proj), held one at a time",
            "cohere2": "tensors: rotary pairs interleaved in the file, q/k rows held "
                       "reordered",
            "llama4_text": "chunks of 8 on 1 of 2 layers\n  q/k RMS-normalised per head "
                           "without a weight on the rope layers\n  NoPE layers' queries times "
                           "1 + 0.5 log(1 + floor((p + 1) / 4))\n  experts 4 (1 a token) on 1 "
                           "of 2 layers; sigmoid router, each expert reading its token times its "
                           "weight, 1 shared\n  tensors: rotary pairs interleaved in the file",
            "granitemoe": "experts 4 (2 a token) on 2 of 2 layers\n  tensors: experts "
                          "stacked (gate/up fused) in the file, held split",
            "gemma4_text": "full layers: heads of 64 on 1 kv heads, values equal to keys; 16 "
                           "of 64 dimensions turn\n  sliding window 8 on 1 of 2 layers\n  "
                           "experts 4 (2 a token) on 2 of 2 layers, beside each MLP\n  tensors: "
                           "router and stacked experts on each layer in the file, held beside "
                           "its MLP as moe.gate and one expert at a time",
            "qwen3_next": "experts 4 (2 a token) on 1 of 2 layers; a gated shared expert of "
                          "64\n  tensors: DeltaNet projections fused and grouped by key "
                          "head in the file (in_proj_qkvz, in_proj_ba), held split"}[family] in said.stderr
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    # (GLM-4.5's and MiniMax-M2's sigmoid routers: their rollouts' experts replayed, a balance
    # loss of its kind)
    graph = write_graph(tmp_path, folder, prompts, *(
        ("routing_replay=True", "router_aux_loss_coef=0.01") if replayed else ()))
    s = run(graph, steps=2, out=tmp_path / "out", console=False, sets=["live=false"]).summary
    assert s["error"] is None and s["steps"] == 2 and s["ledger"]["groups_trained"] == 4
    assert s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    gaps = [r["train_rollout_logprob_gap"] for r in read_metrics(tmp_path / "out" / "metrics.jsonl")
            if "train_rollout_logprob_gap" in r]
    assert gaps and max(gaps) < 1e-4, gaps
    ckpt = tmp_path / "out" / "checkpoints" / "policy"
    loader = (transformers.Mistral4ForCausalLM if family == "mistral4"  # (no auto class)
              else AutoModelForCausalLM)
    theirs, info = loader.from_pretrained(ckpt, output_loading_info=True)
    assert type(theirs).__name__ == model_class and not info["missing_keys"]
    before, after = load_file(folder / "model.safetensors"), load_file(ckpt / "model.safetensors")
    assert before.keys() - after.keys() == (set(MTP_LAYER) if mtp else set())
    assert after.keys() <= before.keys()
    for name in moved:
        assert not torch.equal(before[name], after[name]), name
    if sigmoid:  # (a load statistic, not a weight: frozen)
        bias = {"minimax_m2": "model.layers.1.block_sparse_moe.e_score_correction_bias",
                "ernie4_5_moe": "model.layers.1.mlp.moe_statics.e_score_correction_bias",
                "lfm2_moe": "model.layers.1.feed_forward.expert_bias",
                "afmoe": "model.layers.1.mlp.expert_bias",
                "hy_v3": "model.layers.1.mlp.expert_bias"}.get(
            family, "model.layers.1.mlp.gate.e_score_correction_bias")
        assert torch.equal(before[bias], after[bias])
    if family == "apertus":  # (xIELU's constants: not weights)
        for name in ("model.layers.1.mlp.act_fn.beta", "model.layers.1.mlp.act_fn.eps"):
            assert torch.equal(before[name], after[name])
    if mtp:
        assert json.loads((ckpt / "config.json").read_text())["num_nextn_predict_layers"] == 0
    again = run(graph, steps=3, out=tmp_path / "out", console=False, resume=str(tmp_path / "out"))
    assert again.summary["steps"] == 3 and again.summary["error"] is None
    if family in LORA_EXPORTS:  # LoRA on pivotflow's layout, exported onto the file's
        from test_lora_run import peft_merges_to_the_policy

        targets, ranks = LORA_EXPORTS[family]
        named = {"qwen3_5_text": targets, "qwen3_next": [
            "q_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
            "out_proj"], "granitemoehybrid": [
            "q_proj", "o_proj", "in_proj", "out_proj", "gate_proj", "up_proj", "down_proj"],
            "nemotron_h": LORA_EXPORTS["nemotron_h"][0],
            "hunyuan_v1_moe": LORA_EXPORTS["hunyuan_v1_moe"][0],
            "afmoe": LORA_EXPORTS["afmoe"][0], "hy_v3": LORA_EXPORTS["hy_v3"][0],
            "gemma4_text": LORA_EXPORTS["gemma4_text"][0],
            "llama4_text": LORA_EXPORTS["llama4_text"][0],
            "lfm2": ["q_proj", "o_proj", "in_proj", "out_proj", "gate_proj", "up_proj",
                     "down_proj"],
            "olmo_hybrid": ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_a",
                            "in_proj_b", "in_proj_z", "out_proj", "down_proj"]}.get(family)
        named = f", lora_target_modules={named}" if named else ""
        lora = write_graph(tmp_path / "out", folder, prompts, train=f"lora_rank=4{named}")
        from pivotflow import checkpoints

        done = run(lora, steps=2, out=tmp_path / "lora", console=False,
                   sets=["live=false", "checkpoint_every=2"])
        assert done.summary["error"] is None
        ckpt = checkpoints.latest(tmp_path / "lora")
        assert ckpt is not None
        adapter = json.loads((ckpt / "adapter" / "adapter_config.json").read_text())
        assert adapter["target_modules"] == targets and adapter["rank_pattern"] == ranks
        peft_merges_to_the_policy(ckpt)


@pytest.mark.parametrize("variant", ["gemma3", "gemma4", "gemma4-e2b", "gemma4-moe"])
def test_a_gemma_wrapper_folder_trains_its_text_model_and_writes_a_causal_lm(
        tmp_path: Path, qwen: Path, variant: str) -> None:
    """Gemma 3 4B and larger, and every Gemma 4, are *ForConditionalGeneration folders (the
    text model under ``language_model.``, a vision tower beside it): the run trains the text
    model, its rollouts' logprobs equal its trainer's, and its checkpoint is that model as a
    causal LM, trained, which transformers loads (Gemma 4's layer scalars as they were: a
    constant of the checkpoint; E2B's kind: its per-layer inputs trained, two of three layers
    attending over the first's keys and values; 26B-A4B's: its experts beside the MLP trained
    on the rollouts' routing, with a load-balancing loss, and stacked again in the file)."""
    family = variant.split("-")[0]
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, GenerationConfig

    from pivotflow.metrics import read_metrics
    from pivotflow.run import run

    folder = copy_model(qwen, tmp_path / family, skip=("model.safetensors", "config.json"))
    torch.manual_seed(0)
    vocab = json.loads((qwen / "config.json").read_text())["vocab_size"]
    policy = _gemma_wrapper(variant, vocab)
    policy.generation_config = GenerationConfig(eos_token_id=[2, 0], pad_token_id=0)
    policy.save_pretrained(folder)
    said = cli("model", str(folder))
    assert said.returncode == 0 and f"{folder}: {family}_text, " in said.stderr, said.stderr
    assert ("its vision tower and projector not loaded" if family == "gemma3"
            else "its vision and audio towers not loaded") in said.stderr
    moe = variant == "gemma4-moe"
    graph = write_graph(tmp_path, folder, write_prompts(tmp_path / "prompts.jsonl"),
                        *(("routing_replay=True", "router_aux_loss_coef=0.01") if moe else ()))
    s = run(graph, steps=2, out=tmp_path / "out", console=False, sets=["live=false"]).summary
    assert s["error"] is None and s["steps"] == 2 and s["ledger"]["lost"] == 0
    metrics = read_metrics(tmp_path / "out" / "metrics.jsonl")
    gaps = [r["train_rollout_logprob_gap"] for r in metrics if "train_rollout_logprob_gap" in r]
    assert gaps and max(gaps) < 1e-4, gaps
    assert any("train_router_aux_loss" in r for r in metrics) == moe
    ckpt = tmp_path / "out" / "checkpoints" / "policy"
    theirs, info = AutoModelForCausalLM.from_pretrained(ckpt, output_loading_info=True)
    assert type(theirs).__name__ == f"{family.title()}ForCausalLM" and not info["missing_keys"]
    before, after = load_file(folder / "model.safetensors"), load_file(ckpt / "model.safetensors")
    assert not any("vision" in n for n in after)
    inner = "language_model.model." if family == "gemma3" else "model.language_model."
    name = "layers.1.mlp.up_proj.weight"
    assert not torch.equal(before[inner + name], after[f"model.{name}"])
    if family == "gemma4":
        scalar = "layers.1.layer_scalar"
        assert torch.equal(before[inner + scalar], after[f"model.{scalar}"])
    if variant == "gemma4-e2b":
        name = "embed_tokens_per_layer.weight"
        assert not torch.equal(before[inner + name], after[f"model.{name}"])
        assert "model.layers.2.self_attn.k_proj.weight" not in after
    for name in (("layers.0.router.proj.weight", "layers.1.router.per_expert_scale",
                  "layers.1.experts.gate_up_proj", "layers.0.experts.down_proj") if moe else ()):
        assert not torch.equal(before[inner + name], after[f"model.{name}"]), name
    if variant in ("gemma3", "gemma4"):  # LoRA on the wrapper's text model, as PEFT loads it
        from pivotflow import checkpoints

        lora = write_graph(tmp_path / "out", folder, write_prompts(tmp_path / "prompts.jsonl"),
                           train="lora_rank=4")
        done = run(lora, steps=2, out=tmp_path / "lora", console=False,
                   sets=["live=false", "checkpoint_every=2"])
        assert done.summary["error"] is None
        latest = checkpoints.latest(tmp_path / "lora")
        assert latest is not None
        peft_merges_to_the_wrappers_text_model(latest)


def peft_merges_to_the_wrappers_text_model(ckpt: Path) -> None:
    """PEFT loads the checkpoint's adapter onto the wrapper folder it names (its text model's
    modules alone: ``target_modules`` a pattern) and merges it: the wrapper's text model is the
    checkpoint's policy (a causal LM), float32 rounding apart; its vision tower untouched."""
    import torch
    import transformers
    from peft import PeftModel

    config = json.loads((ckpt / "adapter" / "adapter_config.json").read_text())
    base_path = Path(config["base_model_name_or_path"])
    wrapper = getattr(transformers, json.loads((base_path / "config.json").read_text())[
        "architectures"][0])
    assert isinstance(config["target_modules"], str)
    before = wrapper.from_pretrained(base_path, dtype=torch.float32).state_dict()
    merged = PeftModel.from_pretrained(wrapper.from_pretrained(base_path, dtype=torch.float32),
                                       str(ckpt / "adapter")).merge_and_unload().state_dict()
    policy = transformers.AutoModelForCausalLM.from_pretrained(
        ckpt / "policy", dtype=torch.float32).state_dict()
    assert merged.keys() == before.keys()
    text = {k: w for k, w in merged.items() if k.startswith("model.language_model.")}
    assert {"model." + k.removeprefix("model.language_model.") for k in text} | {
        "lm_head.weight"} >= policy.keys() - {"lm_head.weight"}
    for k, w in policy.items():
        theirs = merged[k if k == "lm_head.weight" else
                        "model.language_model." + k.removeprefix("model.")]
        torch.testing.assert_close(theirs, w, rtol=0, atol=1e-6, msg=k)
    assert any(not torch.equal(w, before[k]) for k, w in text.items())
    for k, w in merged.items():  # (the vision tower and projector as they were)
        if not k.startswith(("model.language_model.", "lm_head.")):
            assert torch.equal(w, before[k]), k


def _gemma_wrapper(variant: str, vocab: int) -> Any:
    """A two-layer Gemma 3 (sliding then full) or Gemma 4 (values equal to keys and heads
    twice as wide on its full layer, its layer scalars random; E2B's kind: three layers, per-
    layer inputs, the last two sharing the first's keys and values) wrapper with a one-layer
    vision tower, from transformers."""
    import torch
    import transformers

    text = {"vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 32, "max_position_embeddings": 256, "sliding_window": 8,
            "eos_token_id": 0, "pad_token_id": 0}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 2}
    if variant == "gemma3":
        return transformers.Gemma3ForConditionalGeneration(transformers.Gemma3Config(
            text_config=text, vision_config={**vision, "image_size": 28, "patch_size": 14},
            mm_tokens_per_image=4, image_token_index=vocab - 1, boi_token_index=vocab - 3,
            eoi_token_index=vocab - 2))
    gemma4 = ({"global_head_dim": 64, "num_global_key_value_heads": 1, "attention_k_eq_v": True,
               "hidden_size_per_layer_input": 0} if variant in ("gemma4", "gemma4-moe") else
              {"global_head_dim": 64, "num_hidden_layers": 3, "hidden_size_per_layer_input": 8,
               "vocab_size_per_layer_input": vocab, "num_kv_shared_layers": 2,
               "layer_types": ["full_attention"] * 3})
    if variant == "gemma4-moe":
        gemma4.update(enable_moe_block=True, num_experts=4, top_k_experts=2,
                      moe_intermediate_size=32)
    model = transformers.Gemma4ForConditionalGeneration(transformers.Gemma4Config(
        text_config={**text, **gemma4}, vision_config=vision, audio_config=None))
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(1.0 + 0.2 * torch.randn_like(b))
    return model


EXAMPLE = Path(__file__).parents[1] / "examples" / "byo_model.py"


def copy_model(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.name not in skip:
            shutil.copy(f, dst / f.name)
    return dst


def assert_one_line_error(done: subprocess.CompletedProcess[str], *names: str) -> str:
    """Exit 2 with one line on stderr naming ``names``; no traceback, no file dumped."""
    err = done.stderr.strip()
    assert done.returncode == 2, err[-3000:]
    assert err.startswith("error:") and "\n" not in err, err
    assert "Traceback" not in err and len(err) < 600, err
    assert '"version"' not in err and "merges" not in err, err  # no tokenizer.json content
    for name in names:
        assert name in err, (name, err)
    return err


def test_a_tokenizer_bigger_than_the_vocabulary_is_named(tmp_path: Path, qwen: Path) -> None:
    small = copy_model(qwen, tmp_path / "small", skip=("model.safetensors", "config.json"))
    save_qwen2(small, vocab_size=300)  # the tokenizer has 322 tokens
    graph = write_graph(tmp_path, small, write_prompts(tmp_path / "p.jsonl"))
    err = assert_one_line_error(cli("run", str(graph), "--set", "live=false"),
                                str(small / "tokenizer.json"), str(small / "config.json"),
                                "vocab_size 300", "322 tokens")
    assert "model 'policy'" in err


def test_a_folder_without_a_tokenizer_is_named(tmp_path: Path, qwen: Path) -> None:
    bare = copy_model(qwen, tmp_path / "bare", skip=("tokenizer.json", "tokenizer_config.json",
                                                     "chat_template.jinja"))
    graph = write_graph(tmp_path, bare, write_prompts(tmp_path / "p.jsonl"))
    # the graph file itself loads the tokenizer: keep its own load out of the way
    graph.write_text(graph.read_text().replace("TOK = load_tokenizer(MODEL)", "TOK = None"))
    assert_one_line_error(cli("run", str(graph), "--set", "live=false"), str(bare),
                          "no tokenizer files", "tokenizer.json")


def test_a_config_key_the_engine_cannot_run_is_named(tmp_path: Path, qwen: Path) -> None:
    broken = copy_model(qwen, tmp_path / "broken")
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu"}))
    graph = write_graph(tmp_path, broken, write_prompts(tmp_path / "p.jsonl"))
    assert_one_line_error(cli("run", str(graph), "--set", "live=false"),
                          str(broken / "config.json"), "hidden_act")


def test_pivotflow_model_says_what_a_folder_runs_as_and_names_what_it_cannot(
        tmp_path: Path, qwen: Path) -> None:
    """``pivotflow model FOLDER`` reads the folder as a run does, before any graph: its shape,
    rope, context, tokenizer and stop ids; a broken folder is the run's own one-line error."""
    done = cli("model", str(qwen))
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stderr
    assert f"{qwen}: qwen2, " in out and "tied embeddings" in out
    assert "layers 2, hidden 64, heads 2 on 1 kv heads of 32" in out
    assert "context 256 (max_position_embeddings)" in out
    assert "a chat template; stop ids [2, 0]" in out
    broken = copy_model(qwen, tmp_path / "broken")
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu"}))
    assert_one_line_error(cli("model", str(broken)), str(broken / "config.json"), "hidden_act")
    assert_one_line_error(cli("model", str(tmp_path / "none")), "no such model folder")
    bare = copy_model(qwen, tmp_path / "bare", skip=("tokenizer.json", "tokenizer_config.json"))
    assert_one_line_error(cli("model", str(bare)), "no tokenizer files")
    # a family it does not run names where the list is, not the whole list
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "gemma3n"}))
    assert_one_line_error(cli("model", str(broken)), "model_type='gemma3n' is not supported",
                          "`pivotflow model --families` lists the")
    families = cli("model", "--families")
    assert families.returncode == 0, families.stderr[-2000:]
    assert "decoders (" in families.stderr and "seed_oss" in families.stderr
    assert "qwen3_vl_moe -> qwen3_moe" in families.stderr
    assert_one_line_error(cli("model"), "pivotflow model needs a model FOLDER (or --families)")


@pytest.mark.parametrize(("row", "says"), [
    ({"prompt": [{"role": "user"}], "answer": 1}, "message 0 needs a string 'content' (missing)"),
    ({"prompt": [{"content": "1+1="}], "answer": 1},
     "message 0 needs a non-empty string 'role' (missing)"),
    ({"prompt": [{"role": "user", "content": "1"}, {"role": 3, "content": "x"}], "answer": 1},
     "message 1 needs a non-empty string 'role' (int)"),
    ({"prompt": [], "answer": 1}, "the message list is empty"),
    ({"prompt": ["1+1="], "answer": 1}, "message 0 is a str, not an object with role and content"),
    ({"prompt": {"role": "user", "content": "1+1="}, "answer": 1},
     "must be a non-empty string (dict {'role': 'user', 'content': '1+1='}; columns: "
     "['answer', 'prompt']) or a list of chat messages"),
])
def test_a_malformed_message_list_names_the_file_line_and_column(
        tmp_path: Path, qwen: Path, row: dict[str, object], says: str) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [
        {"prompt": [{"role": "user", "content": "1+2="}], "answer": 3}, row])
    from pivotflow.errors import TaskError

    with pytest.raises(TaskError) as info:
        load_prompt_file(prompts)
    sep = " " if says.startswith("must") else ": "
    assert str(info.value) == f"{prompts}:line 2: the prompt column 'prompt'{sep}{says}"
    if says.startswith("message 0 needs a string"):  # and through the CLI, once
        graph = write_graph(tmp_path, qwen, prompts)
        assert_one_line_error(cli("inspect", str(graph)), f"{prompts}:line 2", "'prompt'",
                              says)


def test_the_example_builds_a_folder_pivotflow_runs(
        tmp_path: Path, script: Callable[[Path], ModuleType]) -> None:
    """examples/byo_model.py (run end to end by hand: 3 steps in ~40 s): its folder and
    prompts load, and its graph builds with the judge, as a newcomer's copy would."""
    from pivotflow.engines.torch.weights import load_model_folder
    from pivotflow.graph_check import load_graph
    from pivotflow.run_models import tokenizer_of

    module = script(EXAMPLE)  # its model folder and prompt file writers
    model = module.build_tiny_folder(tmp_path / "model")
    prompts = module.write_prompts(tmp_path / "prompts.jsonl", n=4)
    folder = load_model_folder(model)
    tok = tokenizer_of(model, folder.config.vocab_size)
    assert folder.config.head_dim == 32 and folder.eos_ids == (2, 0)
    assert tok.eos_ids == (0, 2)  # the tokenizer's eos, then generation_config's
    graph = load_graph(EXAMPLE, {**module.DEFAULTS, "model": str(model),
                                 "prompts": str(prompts), "judge": True})
    row = graph.order()[0].options["table"].rows[0]
    text = tok.apply_chat_template(row["prompt"], add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    judge = graph.nodes["genrm"].options
    assert judge["parse"]("so: \\boxed{yes}") == 1.0 and judge["parse"]("No.") == 0.0
    # the trainer's memory knobs reach the train stage's options (the roles' options; what
    # they do: tests/worker/test_train_memory.py)
    graph = load_graph(EXAMPLE, {**module.DEFAULTS, "model": str(model), "prompts": str(prompts),
                                 "gradient_checkpointing": True, "logits_chunk_tokens": 64})
    train = graph.nodes["train"].options
    assert train["gradient_checkpointing"] is True and train["logits_chunk_tokens"] == 64


def test_ppo_on_a_transformers_folder_with_its_own_folder_as_the_critic(
        tmp_path: Path, script: Callable[[Path], ModuleType]) -> None:
    """examples/byo_model.py with ``graph.critic`` = the model's own folder (a tied-embedding
    Qwen2 that transformers saved): the run gives it a value head, trains it two steps, and
    the checkpoint's critic loads in transformers as a one-label classifier. (A random reward
    model scores the responses: the exact rule never rewards a random policy, and a critic
    whose returns are all 0 has nothing to learn.) Two trainers hold the policy's and the
    critic's AdamW states sharded (``graph.zero_stage=1``): the static planner keeps them two
    (backpressure may lend the idle scorer and values workers to training, a world of 4)."""
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        Qwen2ForSequenceClassification,
    )

    from pivotflow import checkpoints
    from pivotflow.metrics import read_metrics
    from pivotflow.run import run

    module = script(EXAMPLE)  # its model folder and prompt file writers
    model = module.build_tiny_folder(tmp_path / "model")
    prompts = module.write_prompts(tmp_path / "prompts.jsonl", n=8)
    rm = tmp_path / "rm"
    torch.manual_seed(1)
    Qwen2ForSequenceClassification(AutoConfig.from_pretrained(model, num_labels=1)
                                   ).save_pretrained(rm)
    for f in model.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, rm / f.name)
    out = tmp_path / "run"
    result = run(EXAMPLE, steps=2, out=out, console=False,
                 sets=["live=false", f"graph.model={model}", f"graph.prompts={prompts}",
                       f"graph.critic={model}", "graph.critic_lr=1e-3",
                       f"graph.reward_model={rm}", "graph.trainer_workers=2",
                       "graph.zero_stage=1", "planner=static"])
    s = result.summary
    assert s["error"] is None and s["ledger"]["lost"] == 0 and s["ledger"]["duplicates"] == 0
    assert {r.get("train_world") for r in read_metrics(out / "metrics.jsonl")} == {2.0}
    ckpt = checkpoints.read(checkpoints.latest(out) or out)
    # each optimizer's state, gathered from both trainers, took one step a version
    for state in (ckpt.optimizer, ckpt.critic_optimizer):
        assert state is not None
        assert {float(v) for k, v in state.items() if k.endswith(".step")} == {2.0}
    assert ckpt.critic_dir is not None
    critic, info = AutoModelForSequenceClassification.from_pretrained(
        ckpt.critic_dir, output_loading_info=True)
    assert not info["missing_keys"] and critic.config.num_labels == 1
    assert float(critic.score.weight.detach().abs().max()) > 0  # the zero head was trained
