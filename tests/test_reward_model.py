"""A discriminative reward model (``Graph.reward_model``): a Qwen2ForSequenceClassification that
transformers saved scores each response, in a real run, exactly as transformers scores the same
conversation; a wrong model in a stage is a one-line error before anything starts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hf_folders import save_tokenizer_hf, train_bpe

from pivotflow.errors import GraphError
from pivotflow.messages import encode_conversation, with_answer
from pivotflow.run import run
from pivotflow.tokenizer import load_tokenizer

pytestmark = pytest.mark.timeout(600)

GRAPH = '''
from pivotflow.graph import Graph
from pivotflow.rl.group_fns import grpo_advantage


def build(config):
    g = Graph("rm")
    g.model("policy", source=%(policy)r)
    g.model("rm", source=%(rm)r, context=%(context)r)
    g.pool("rollout", workers=1)
    g.pool("scorer", workers=1)
    g.pool("trainer", workers=1)
    src = g.source("prompts", path=%(prompts)r, answer_key=None, group_size=4,
                   groups_per_step=2)
    gen = g.generate("rollout", model=%(generator)r, pool="rollout", max_tokens=8)
    rew = g.reward_model("rm", model=%(scorer)r, pool="scorer")
    adv = g.group("advantage", grpo_advantage, writes=["advantage"])
    g.chain(src, gen, rew, adv, g.train("train", model="policy", pool="trainer", lr=1e-3))
    return g
'''


def _config(vocab: int) -> dict:
    return dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                max_position_embeddings=256, tie_word_embeddings=True, eos_token_id=0,
                bos_token_id=None, pad_token_id=0)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A random policy and a random one-label reward model, both saved by transformers next
    to the same BPE tokenizer with a ChatML template; and a prompt file of chat messages."""
    from transformers import (
        GenerationConfig,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen2ForSequenceClassification,
    )

    root = tmp_path_factory.mktemp("rm")
    policy, rm = root / "policy", root / "rm"
    vocab = save_tokenizer_hf(train_bpe(), policy)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**_config(vocab)))
    model.generation_config = GenerationConfig(eos_token_id=[2, 0], pad_token_id=0)
    model.save_pretrained(policy)
    torch.manual_seed(1)
    Qwen2ForSequenceClassification(Qwen2Config(**_config(vocab), num_labels=1)).save_pretrained(rm)
    # a classifier of two labels: not a reward model
    two = root / "two_labels"
    Qwen2ForSequenceClassification(Qwen2Config(**_config(vocab), num_labels=2)).save_pretrained(two)
    for folder in (rm, two):  # the same tokenizer files beside the classifiers' weights
        for f in policy.iterdir():
            if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
                shutil.copy(f, folder / f.name)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(
        json.dumps({"prompt": [{"role": "user", "content": f"What is {a}+{a + 7}?"}]}) + "\n"
        for a in range(10, 30)))
    return {"policy": policy, "rm": rm, "two_labels": two, "prompts": prompts, "root": root}


def transformers_scores(rm: Path, sequences: list[list[int]]) -> list[float]:
    from transformers import Qwen2ForSequenceClassification

    model = Qwen2ForSequenceClassification.from_pretrained(rm).eval()
    with torch.no_grad():
        return [float(model(torch.tensor([ids])).logits[0, 0]) for ids in sequences]


def test_the_score_head_reads_as_transformers_does(folders: dict[str, Path]) -> None:
    """A right-padded batch of three lengths: each score is transformers' for that sequence
    alone (the last real token's, not the padding's)."""
    from pivotflow.engines.torch.weights import build_model, load_model_folder
    from pivotflow.worker.reward_scoring import sequence_scores
    from pivotflow.worker.train_role import pad_sequences

    folder = load_model_folder(folders["rm"])
    assert folder.config.num_labels == 1
    model = build_model(folder.config, folder.tensors)
    sequences = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19]]
    with torch.no_grad():
        ours = sequence_scores(model, pad_sequences(sequences)).tolist()
    assert ours == pytest.approx(transformers_scores(folders["rm"], sequences), abs=1e-5)


def write_graph(folders: dict[str, Path], name: str, generator: str = "policy",
                scorer: str = "rm", rm: str = "rm", context: int | None = None) -> Path:
    graph = folders["root"] / f"{name}.py"
    graph.write_text(GRAPH % {"policy": str(folders["policy"]), "rm": str(folders[rm]),
                              "prompts": str(folders["prompts"]), "generator": generator,
                              "scorer": scorer, "context": context})
    return graph


def test_a_run_rewards_each_response_with_the_reward_models_score(
        folders: dict[str, Path], tmp_path: Path) -> None:
    """Two real steps; every logged sample's reward is transformers' score of its prompt and
    response as one conversation in the reward model's chat template."""
    out = tmp_path / "out"
    run(write_graph(folders, "rm_graph"), sets=["live=false", "log_samples=-1"], out=out,
        steps=2, console=False)
    samples = [json.loads(line) for line in (out / "samples.jsonl").open()]
    assert len(samples) == 16
    tok = load_tokenizer(folders["rm"])
    sequences = [encode_conversation(tok, with_answer(s["prompt"], s["response"]))
                 for s in samples]
    assert tok.decode(sequences[0], skip_special=False).endswith(
        samples[0]["response"] + "<|im_end|>\n")  # the answer closes the conversation
    expected = transformers_scores(folders["rm"], sequences)
    assert [s["reward"] for s in samples] == pytest.approx(expected, abs=1e-4)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ledger"]["samples_trained"] == 16 and summary["error"] is None


@pytest.mark.parametrize(("generator", "scorer", "rm", "says"), [
    ("policy", "policy", "rm", r"reward_model 'rm' at .*: model 'policy' \(.*config.json\) is a "
                               r"causal LM; a reward model is a \*ForSequenceClassification"),
    ("rm", "rm", "rm", r"generate 'rollout' at .*: model 'rm' \(.*config.json\) is a sequence "
                       r"classifier, which scores sequences and cannot generate or train"),
    ("policy", "rm", "two_labels", r"reward_model 'rm' at .*: model 'rm' \(.*config.json\) is "
                                   r"a classifier with 2 labels; a reward model is"),
])
def test_a_model_in_the_wrong_kind_of_stage_is_a_one_line_error(
        folders: dict[str, Path], tmp_path: Path, generator: str, scorer: str, rm: str,
        says: str) -> None:
    graph = write_graph(folders, f"bad_{generator}_{scorer}_{rm}", generator, scorer, rm)
    with pytest.raises(GraphError, match=says) as err:
        run(graph, sets=["live=false"], out=tmp_path / "out", steps=1, console=False)
    assert "\n" not in str(err.value)


def test_a_conversation_longer_than_the_reward_model_reads_stops_the_run(
        folders: dict[str, Path], tmp_path: Path) -> None:
    """Served with 16 positions (``context=16``), the reward model cannot read a prompt and
    response of ~30 tokens: the run stops with one line naming the stage, the sample and why,
    not a truncated score."""
    graph = write_graph(folders, "short_rm", context=16)
    with pytest.raises(GraphError, match=r"reward_model 'rm' at .* on sample \d+: job \d+: "
                                         r"\d+ tokens exceed the reward model's "
                                         r"max_position_embeddings 16") as err:
        run(graph, sets=["live=false"], out=tmp_path / "out", steps=1, console=False)
    assert "\n" not in str(err.value)


def test_a_template_gives_the_reward_model_its_own_text(folders: dict[str, Path]) -> None:
    """``template=`` returning a string: the reward model reads exactly that text (with what
    its tokenizer adds to a raw string); returning something else is a one-line error."""
    from pivotflow.controller import stages
    from pivotflow.controller.sample import Sample
    from pivotflow.graph import Graph

    g = Graph("t")
    node = g.reward_model("rm", model="rm", pool="p",
                          template=lambda prompt, response, **_: f"Q: {prompt} A: {response}")
    tok = load_tokenizer(folders["rm"])
    sample = Sample(1, 1, 0, 0, 7, {"prompt": "1+1=", "response": "2"})
    job = stages.reward_job(node, sample, 5, tok)
    assert job.prompt_ids == tok.encode("Q: 1+1= A: 2", add_special_tokens=True)
    assert job.max_tokens == 0 and job.prefix_ids == []
    bad = g.reward_model("rm2", model="rm", pool="p", template=lambda **_: 3)
    with pytest.raises(GraphError, match=r"reward_model 'rm2' at .*: template returned int"):
        stages.reward_job(bad, sample, 6, tok)
