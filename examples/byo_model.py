"""Bring your own model: a Hugging Face folder, prompts as chat messages, a rule or GenRM reward.

    python examples/byo_model.py [--steps 5] [--out runs/byo]      # a tiny folder, built here
    pivotflow run examples/byo_model.py --set graph.model=/path/to/Qwen2.5-0.5B-Instruct \\
        --set graph.prompts=my_prompts.jsonl --set dtype=bf16 --set device=cuda

A model is a folder as ``save_pretrained`` writes it: config.json, model.safetensors (or shards
with model.safetensors.index.json), generation_config.json (its eos ids stop generation), and
the tokenizer (tokenizer.json, tokenizer_config.json, a chat template). ``main`` builds a tiny
one with transformers (a random Qwen2 next to a byte-level BPE trained on a few lines) so the
example runs anywhere in a minute; a random model learns nothing, so read it for the wiring.

Prompts (``prompts.jsonl``) hold a list of chat messages per row, as verl's and TRL's datasets
do; the policy's chat template renders them (``add_generation_prompt``). A plain string prompt
is encoded raw unless the source says ``chat_template=True``. ``--set graph.reward_model=DIR``
scores each response with a discriminative reward model (a ``*ForSequenceClassification``
folder with one label) instead of the rule. With ``--set graph.judge=true``
the reward comes from a GenRM judge instead of the exact rule: its template returns messages
(rendered with the judge's own chat template) and ``pivotflow.verdicts`` parses its text.

PPO with a learned critic: ``--set graph.critic=DIR`` (the model's own folder, as verl starts its
critic, or a reward model's, as OpenRLHF does) scores the state before each response token, GAE
gives per-token advantages, and the trainer steps the critic beside the policy
(``graph.critic_lr``); each prompt is then sampled ``group_size`` times as before.

LoRA: ``--set graph.lora_rank=8 --set graph.lr=1e-4`` trains a rank-8 update of every linear
layer instead of every weight (LoRA wants a larger rate than full training); checkpoints then
hold PEFT's ``adapter/`` beside the merged ``policy/``. ``--set graph.adapter=DIR`` starts the
run from an SFT adapter (a PEFT LoRA folder) merged into the model.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

from pivotflow.graph import Graph
from pivotflow.rl.group_fns import gae_advantage, grpo_advantage
from pivotflow.tasks.arithmetic import check_answer
from pivotflow.verdicts import boxed, first_of, yes_no

DEFAULTS = {"model": "", "prompts": "prompts.jsonl", "judge": False, "max_tokens": 16,
            "group_size": 4, "groups_per_step": 2, "lr": 1e-5,
            # the trainer's memory (worker/train_config.py; bench/train_memory.py): recompute
            # the layers in the backward pass, and the output head's logits in chunks of this
            # many positions (0: whole); both trade compute for memory, neither changes a step
            "gradient_checkpointing": False, "logits_chunk_tokens": 0,
            # LoRA (worker/lora.py): a rank-r update of every linear layer, the weights frozen
            # and the AdamW state the adapters' alone (0: train every weight)
            "lora_rank": 0, "lora_alpha": 16.0,
            # trainers (a data-parallel group) and how they hold AdamW's state: zero_stage 0
            # whole on each, 1 sharded over them (worker/group_adam.py: 1/n of it on each);
            # train_dtype bfloat16 holds the model in bf16, with float32 master weights beside
            # the sharded moments under zero_stage 1 (bf16 throughout under 0)
            "trainer_workers": 1, "zero_stage": 0, "train_dtype": "float32",
            # a PEFT LoRA adapter folder (an SFT run's) merged into the model as it loads: the run
            # starts from base + adapter
            "adapter": "",
            # a discriminative reward model's folder (*ForSequenceClassification, one label):
            # its score is the reward, instead of the exact rule or a judge
            "reward_model": "",
            # PPO's critic (Graph.critic): a causal LM folder (given a zero value head) or a
            # one-label classifier's; GAE's advantages instead of GRPO's ("": GRPO)
            "critic": "", "critic_lr": 1e-5,
            # a mixture-of-experts policy (qwen3_moe): replay the rollout's expert choices in
            # the trainer's forward passes (rollout routing replay, R3; Graph.generate), and
            # add its load-balancing loss times this (transformers' router_aux_loss_coef; 0: off)
            "routing_replay": False, "router_aux_loss_coef": 0.0}


def exact_reward(answer: str, completion: str, **_: object) -> float:
    """1.0 when the completion holds the right number (the row's ``answer`` column)."""
    return 1.0 if check_answer(answer, completion) else 0.0


def judge_template(prompt: list[dict[str, str]], response: str, **_: object) -> list[dict]:
    """The GenRM's prompt as messages: the question (the row's last user turn) and the answer."""
    question = prompt[-1]["content"]
    return [{"role": "system", "content": "You check answers. Reply Yes or No."},
            {"role": "user", "content": f"Question: {question}\nAnswer: {response}\nRight?"}]


def build(config: dict) -> Graph:
    if not config["model"]:
        raise ValueError("set graph.model=/path/to/model/folder (or run this file with python)")
    g = Graph("byo_model")
    g.model("policy", source=config["model"], adapter=config["adapter"] or None)
    g.pool("rollout", workers=1)
    g.pool("trainer", workers=config["trainer_workers"])
    prompts = g.source("prompts", path=config["prompts"], check_with="arithmetic",
                       group_size=config["group_size"],
                       groups_per_step=config["groups_per_step"])
    rollout = g.generate("rollout", model="policy", pool="rollout",
                         max_tokens=config["max_tokens"], routing_replay=config["routing_replay"])
    if config["reward_model"]:
        g.model("rm", source=config["reward_model"])
        g.pool("scorer", workers=1)
        reward = g.reward_model("rm", model="rm", pool="scorer")
    elif config["judge"]:  # the same folder as the judge here; name any other one
        g.model("judge", source=config["model"])
        g.pool("genrm", workers=1)
        reward = g.judge("genrm", model="judge", pool="genrm", template=judge_template,
                         parse=first_of(boxed, yes_no), max_tokens=16)
    else:
        reward = g.map("reward", exact_reward, writes=["reward"])
    critic: list = []
    if config["critic"]:
        g.model("critic", source=config["critic"])
        g.pool("values", workers=1)
        critic = [g.critic("critic", model="critic", pool="values")]
        advantage = g.map("gae", gae_advantage(), writes=["advantage", "returns"])
    else:
        advantage = g.group("advantage", grpo_advantage, writes=["advantage"])
    critic_knobs = {"critic_lr": config["critic_lr"]} if config["critic"] else {}
    train = g.train("train", model="policy", pool="trainer", lr=config["lr"],
                    gradient_checkpointing=config["gradient_checkpointing"],
                    logits_chunk_tokens=config["logits_chunk_tokens"],
                    lora_rank=config["lora_rank"], lora_alpha=config["lora_alpha"],
                    zero_stage=config["zero_stage"], train_dtype=config["train_dtype"],
                    router_aux_loss_coef=config["router_aux_loss_coef"],
                    **critic_knobs)
    g.chain(prompts, rollout, reward, *critic, advantage, train)
    return g


CHATML = ("{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
          "'<|im_end|>\\n' }}{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def build_tiny_folder(folder: Path, seed: int = 0) -> Path:
    """A random Qwen2 (hidden 64, head_dim 32, 2 layers) and a byte-level BPE with a ChatML
    template, saved by transformers as any Hugging Face model folder is."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        GenerationConfig,
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([  # digits one by one, as Qwen's and Llama 3's
        pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel()])
    bpe.decoder = decoders.ByteLevel()
    rng = random.Random(seed)
    lines = [f"What is {a}+{b}? {a + b}" for a, b in
             ((rng.randint(0, 99), rng.randint(0, 99)) for _ in range(500))]
    bpe.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=320, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>",
                                  pad_token="<|endoftext|>",
                                  additional_special_tokens=specials[1:])
    tok.chat_template = CHATML
    tok.save_pretrained(folder)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        max_position_embeddings=256, tie_word_embeddings=True, eos_token_id=0, pad_token_id=0))
    # stop on <|im_end|> as well as EOS, as Qwen's instruct models do
    model.generation_config = GenerationConfig(eos_token_id=[2, 0], pad_token_id=0)
    model.save_pretrained(folder)
    return folder


def run_on_tiny_model(example: Path, out: Path, steps: int, sets: list[str]) -> None:
    """``example`` (a graph written for a real model folder: ``graph.model``) run for
    ``steps`` on the tiny random model, built in ``out``: its wiring, end to end."""
    from pivotflow.run import run

    model = build_tiny_folder(out / "model")
    result = run(example, steps=steps, out=out / "run", sets=[f"graph.model={model}", *sets])
    s = result.summary
    print(f"{s['steps']} steps on {model}; lost {s['ledger']['lost']}; records: {result.out}")


def write_prompts(path: Path, n: int = 64, seed: int = 1) -> Path:
    """``n`` sums as rows of chat messages with their answer."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(n):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            row = {"prompt": [{"role": "system", "content": "Answer with the number only."},
                              {"role": "user", "content": f"What is {a}+{b}?"}],
                   "answer": a + b}
            f.write(json.dumps(row) + "\n")
    return path


def main() -> None:
    from pivotflow.run import run

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--judge", action="store_true", help="reward by a GenRM judge")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="byo-"))
    out.mkdir(parents=True, exist_ok=True)
    model = build_tiny_folder(out / "model")
    prompts = write_prompts(out / "prompts.jsonl")
    result = run(Path(__file__), steps=args.steps, out=out / "run",
                 sets=[f"graph.model={model}", f"graph.prompts={prompts}",
                       f"graph.judge={json.dumps(args.judge)}"])
    s = result.summary
    print(f"{s['steps']} steps on {model}; lost {s['ledger']['lost']}, judge failures "
          f"{s['judge_failures']}; the trained policy (loads with AutoModelForCausalLM and "
          f"AutoTokenizer): {result.out / 'checkpoints' / 'policy'}")


if __name__ == "__main__":
    main()
