"""PPO's critic in a graph: a wrong critic is a one-line error before anything starts, a GAE
function that writes the wrong number of advantages stops the run naming it, a reward model's
folder serves as the critic (OpenRLHF's start), and the controller whitens a step's per-token
advantages over the whole batch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from pivotflow.controller.train_tokens import carries_signal, whiten_token_advantages
from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.engines.torch.weights import save_checkpoint
from pivotflow.errors import GraphError, StageError
from pivotflow.graph import Graph
from pivotflow.graph_check import validate
from pivotflow.metrics import read_metrics
from pivotflow.protocol import TrainSeq
from pivotflow.rl.group_fns import gae_advantage, grpo_advantage
from pivotflow.run import run

pytestmark = pytest.mark.timeout(300)

GRAPH = '''
from pivotflow.graph import Graph
from pivotflow.rl.group_fns import gae_advantage

GAE = gae_advantage()


def reward(answer, completion, **_):
    return float(completion.strip() == answer)


def advantages(reward, values, response_ids, **_):
    out = GAE(reward=reward, values=values, response_ids=response_ids)
    return {{"advantage": out["advantage"]{cut}, "returns": out["returns"]}}


def build(config):
    g = Graph("ppo")
    g.model("policy", source={policy!r})
    g.model("critic", source={critic!r})
    g.pool("rollout", workers=1)
    g.pool("values", workers=1)
    g.pool("trainer", workers=1)
    src = g.source("prompts", task="arithmetic", digits=2, group_size=1, groups_per_step=8)
    gen = g.generate("rollout", model="policy", pool="rollout", max_tokens=4)
    rew = g.map("reward", reward, writes=["reward"])
    cri = g.critic("critic", model="critic", pool="values")
    gae = g.map("gae", advantages, writes=["advantage", "returns"])  # GAE LINE
    g.chain(src, gen, rew, cri, gae, g.train("train", model="policy", pool="trainer", lr=1e-3))
    return g
'''


def ppo_graph(tmp_path: Path, policy: Path, critic: Path, cut: str = "") -> Path:
    path = tmp_path / "ppo.py"
    path.write_text(GRAPH.format(policy=str(policy), critic=str(critic), cut=cut))
    return path


def classifier(root: Path, policy: Path, labels: int) -> Path:
    """A random one- (or two-) label classifier of the policy's shape, with its tokenizer."""
    cfg = json.loads((policy / "config.json").read_text())
    shape = ModelConfig(vocab_size=cfg["vocab_size"], hidden_size=32, intermediate_size=64,
                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                        max_position_embeddings=64, num_labels=labels)
    folder = root / f"classifier{labels}"
    torch.manual_seed(3)
    save_checkpoint(folder, shape, Decoder(shape).state_dict())
    for f in policy.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "vocab", "merges")):
            shutil.copy(f, folder / f.name)
    return folder


def graph_with_critic(critic_model: str = "critic", gae: bool = True,
                      critics: int = 1, judge_on_critic: bool = False) -> Graph:
    g = Graph("t")
    g.model("policy", source="builtin:policy")
    g.model("critic", source="builtin:policy")
    g.pool("p", workers=1)
    nodes = [g.source("s", task="arithmetic"), g.generate("gen", model="policy", pool="p")]
    if judge_on_critic:
        nodes.append(g.judge("j", model="critic", pool="p", template=lambda **_: "x",
                             parse=lambda verdict, **_: 1.0))
    else:
        nodes.append(g.map("r", lambda **_: 1.0, writes=["reward"]))
    nodes += [g.critic(f"c{i}", model=critic_model, pool="p") for i in range(critics)]
    nodes.append(g.map("gae", gae_advantage(), writes=["advantage", "returns"]) if gae
                 else g.group("adv", grpo_advantage, writes=["advantage"]))
    nodes.append(g.train("t", model="policy", pool="p"))
    g.chain(*nodes)
    return g


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"critic_model": "policy"}, r"critic 'c0' at .*: its model 'policy' is the policy train "
                                 r"'t' trains; declare the critic as a model of its own"),
    ({"critics": 2}, r"critic 'c1' at .*: a graph has at most one critic stage \('c0' at "),
    ({"gae": False}, r"train 't' at .* trains the model of critic 'c0' and needs \['returns'\] "
                     r"upstream of it: put g.map\(\"gae\", "
                     r"pivotflow.rl.group_fns.gae_advantage\(\)"),
    ({"judge_on_critic": True}, r"critic 'c0' at .*: its model 'critic' is also the model of judge 'j' "
                                r"\(at .*\); the run turns it into a value model"),
], ids=["critic-is-the-policy", "two-critics", "no-returns", "model-shared"])
def test_a_wrong_critic_is_a_one_line_graph_error(kwargs: dict, says: str) -> None:
    with pytest.raises(GraphError, match=says) as info:
        validate(graph_with_critic(**kwargs))
    assert "\n" not in str(info.value)


def test_critic_model_is_not_a_train_knob() -> None:
    with pytest.raises(GraphError, match=r"train 't' at .*: critic_model is the model of the "
                                         r"graph's critic stage \(Graph.critic\)"):
        Graph("g").train("t", model="policy", pool="p", critic_model="judge")


def test_a_critic_of_two_labels_is_refused_before_anything_starts(
        tmp_path: Path, random_models: dict[str, Path]) -> None:
    two = classifier(tmp_path, random_models["policy"], 2)
    with pytest.raises(GraphError, match=r"critic 'critic' at .*: model 'critic' \(.*config"
                                         r".json\) is a classifier with 2 labels; a critic is "
                                         r"a causal LM or a one-label classifier"):
        run(ppo_graph(tmp_path, random_models["policy"], two), sets=["live=false"],
            out=tmp_path / "out", steps=1, console=False)


def test_a_critic_with_another_tokenizer_is_refused_before_anything_starts(
        tmp_path: Path, random_models: dict[str, Path]) -> None:
    """A critic scores the policy's token ids, so it must read them as the same text (as a
    reference model must)."""
    from hf_folders import save_tokenizer, train_bpe

    other = tmp_path / "other"
    vocab = save_tokenizer(train_bpe(vocab_size=300), other)
    shape = ModelConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                        max_position_embeddings=64)
    save_checkpoint(other, shape, Decoder(shape).state_dict())
    with pytest.raises(GraphError, match=r"critic 'critic' at .*: model 'critic' has another "
                                         r"tokenizer than the policy 'policy' \(.*\); a "
                                         r"critic must read the policy's token ids") as info:
        run(ppo_graph(tmp_path, random_models["policy"], other), sets=["live=false"],
            out=tmp_path / "out", steps=1, console=False)
    assert "\n" not in str(info.value)


def test_a_gae_function_writing_the_wrong_count_stops_the_run_naming_it(
        tmp_path: Path, random_models: dict[str, Path]) -> None:
    path = ppo_graph(tmp_path, random_models["policy"], random_models["policy"], cut="[:-1]")
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "# GAE LINE" in t)
    with pytest.raises(StageError) as info:
        run(path, sets=["live=false"], out=tmp_path / "out", steps=2, console=False)
    message = str(info.value)
    assert "\n" not in message
    assert f"map 'gae' at {path}:{line} on sample " in message
    assert "advantage values for" in message and "response tokens (one per token)" in message


def test_a_reward_models_folder_serves_as_the_critic(
        tmp_path: Path, random_models: dict[str, Path]) -> None:
    """OpenRLHF starts its critic from the reward model: the classifier's score head is the
    value head, so step 0's values are not zero, and the run trains it."""
    rm = classifier(tmp_path, random_models["policy"], 1)
    out = tmp_path / "out"
    run(ppo_graph(tmp_path, random_models["policy"], rm), sets=["live=false"], out=out,
        steps=2, console=False)
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["train_value_mean"] != 0.0  # the reward model's head, not a zero one
    assert all(r["train_critic_grad_norm"] > 0 for r in records)


def seq(advs: list[float], mask: list[int] | None = None, adv: float = 0.0) -> TrainSeq:
    n = len(advs) or len(mask or [])
    return TrainSeq(job_id=0, prompt_ids=[1], response_ids=[2] * n, logprobs=[0.0] * n,
                    versions=[0] * n, advantage=adv, token_advantages=advs,
                    loss_mask=mask or [])


def test_the_controller_whitens_a_steps_token_advantages_over_the_kept_tokens() -> None:
    a, b = seq([1.0, 2.0, 3.0]), seq([4.0, 100.0], mask=[1, 0])
    grouped = seq([], adv=0.7, mask=[1, 1])
    whiten_token_advantages([a, b, grouped])
    kept = [1.0, 2.0, 3.0, 4.0]  # b's masked token takes no part in the figures
    mean = sum(kept) / 4
    std = (sum((x - mean) ** 2 for x in kept) / 3 + 1e-8) ** 0.5  # (unbiased, as verl's)
    assert a.token_advantages == pytest.approx([(x - mean) / std for x in (1.0, 2.0, 3.0)])
    assert b.token_advantages == pytest.approx([(4.0 - mean) / std, (100.0 - mean) / std])
    assert grouped.advantage == 0.7 and grouped.token_advantages == []  # a group's: as it was
    whitened = a.token_advantages + b.token_advantages[:1]
    assert sum(whitened) == pytest.approx(0.0, abs=1e-9)


def test_a_batch_carries_signal_by_its_token_advantages() -> None:
    assert not carries_signal([seq([0.0, 0.0])])
    assert carries_signal([seq([0.0, 0.5])])
    assert not carries_signal([seq([0.5, 0.5], mask=[0, 0])])  # none of them trained


def test_a_critic_from_a_family_without_a_transformers_classifier_is_one_line() -> None:
    """A critic's folder is a *ForSequenceClassification transformers loads; transformers has
    none for Granite (nor GLM-4.5, OLMoE), so a critic from such a policy is refused by name
    before anything starts, where gpt-oss's becomes GptOssForSequenceClassification."""
    from pivotflow.engines.torch.model_config import ModelConfig
    from pivotflow.run_models import value_model

    tensors = {"model.embed_tokens.weight": torch.zeros(10, 8),
               "lm_head.weight": torch.zeros(10, 8)}
    granite = ModelConfig(vocab_size=10, hidden_size=8, architecture="granite")
    with pytest.raises(GraphError, match=r"^model 'critic' at g\.py:3: a critic is a sequence "
                       r"classifier, and transformers has none for granite \(") as info:
        value_model(tensors, {}, granite, "model 'critic' at g.py:3")
    assert "\n" not in str(info.value)
    oss = ModelConfig(vocab_size=10, hidden_size=8, architecture="gpt_oss")
    body, config = value_model(tensors, {}, oss)
    assert config["architectures"] == ["GptOssForSequenceClassification"]
    assert "lm_head.weight" not in body and body["score.weight"].shape == (1, 8)
