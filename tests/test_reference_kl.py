"""A KL penalty against a frozen reference model, on real worker processes: the reference is
the initial policy (KL exactly 0 before the first update), it stays frozen while the policy
moves, it runs on a pool that time-shares with the trainer, and nothing is lost."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from pivotflow.errors import GraphError
from pivotflow.run import run

FAST = ["live=false", "planner=static"]

GRAPH = '''
from pivotflow.graph import Graph
from pivotflow.rl.group_fns import grpo_advantage

DEFAULTS = {"kl_coef": 0.5, "reference_model": "policy"}


def parity(response_ids, **_):
    """A reward a random policy earns half the time: its first token's parity."""
    return float(response_ids[0] %% 2)


def build(config):
    g = Graph("kl")
    g.model("policy", source=%(policy)r)
    g.model("judge", source=%(judge)r)
    g.pool("rollout", workers=1)
    g.pool("reference", workers=1)
    g.pool("trainer", workers=1)
    src = g.source("prompts", task="arithmetic", group_size=4, groups_per_step=2)
    gen = g.generate("rollout", model="policy", pool="rollout", max_tokens=6)
    ref = g.reference("ref", model=config["reference_model"], pool="reference")
    rew = g.map("reward", parity, writes=["reward"])
    adv = g.group("advantage", grpo_advantage, writes=["advantage"])
    tr = g.train("train", model="policy", pool="trainer", lr=0.01, kl_coef=config["kl_coef"])
    g.chain(src, gen, ref, rew, adv, tr)
    return g
'''


@pytest.fixture
def kl_graph(tmp_path: Path, random_models: dict[str, Path]) -> Path:
    path = tmp_path / "kl_graph.py"
    path.write_text(GRAPH % {"policy": str(random_models["policy"]),
                             "judge": str(random_models["judge"])})
    return path


def test_the_kl_is_against_a_frozen_copy_on_a_pool_that_shifts(
    tmp_path: Path, kl_graph: Path
) -> None:
    # the reference pool and the trainer share one worker (colocated): it shifts into and out
    # of the score role every step
    result = run(kl_graph, sets=[*FAST, "colocate=reference+trainer"], out=tmp_path / "out",
                 workers=2, steps=4, console=False)
    ledger = result.summary["ledger"]
    assert ledger["lost"] == 0 and ledger["duplicates"] == 0 and ledger["groups_trained"] == 8
    steps = [json.loads(line) for line in (result.out / "metrics.jsonl").read_text().splitlines()]
    # step 1 trains the initial policy against its copy, scored by the trainer's own forward
    assert steps[0]["train_kl_ref"] == pytest.approx(0.0, abs=1e-6)
    assert steps[0]["train_grad_norm"] > 0
    # the policy moved and the reference did not follow: were it the latest version (what
    # the trainer holds, with max_staleness 0) the KL would be 0 at every step
    for s in steps[1:]:
        assert s["train_kl_ref"] > 1e-4, s
        assert s["train_kl_loss"] == pytest.approx(s["train_kl_ref"])  # token-mean, one batch
    png = (result.out / "plots" / "kl_ref.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000
    shifts = [json.loads(line) for line in (result.out / "shifts.jsonl").read_text().splitlines()]
    assert {("reference", "trainer"), ("trainer", "reference")} <= {(s["from"], s["to"])
                                                                    for s in shifts}


def test_a_reference_with_another_tokenizer_is_refused_before_any_worker_starts(
    tmp_path: Path, kl_graph: Path, random_models: dict[str, Path]
) -> None:
    from hf_folders import save_tokenizer, train_bpe

    # the judge's weights with a tokenizer trained on other text, of the same size
    other = tmp_path / "other"
    shutil.copytree(random_models["judge"], other)
    rng = random.Random(1)
    texts = [" ".join("".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 6)))
                      for _ in range(8)) for _ in range(400)]
    size = save_tokenizer(train_bpe(texts=texts), other)
    assert size == json.loads((other / "config.json").read_text())["vocab_size"]
    kl_graph.write_text(kl_graph.read_text().replace(repr(str(random_models["judge"])),
                                                     repr(str(other))))
    with pytest.raises(GraphError) as err:
        run(kl_graph, sets=[*FAST, "graph.reference_model=judge"], out=tmp_path / "out",
            workers=3, steps=1, console=False)
    msg = str(err.value)
    assert "reference 'ref' at " in msg and "kl_graph.py:" in msg and "\n" not in msg
    assert ("model 'judge' has another tokenizer than the policy 'policy' (the same ids "
            "decode to other text)") in msg
