"""REINFORCE++ and REINFORCE++-baseline (Hu 2025, arXiv:2501.03262), as stage functions: each
token's advantage is its return to go (the outcome on the last token, the KL in the reward when
asked), after the group's mean reward for the baseline variant; hand-worked numbers."""

from __future__ import annotations

import pytest

from pivotflow.graph import Graph
from pivotflow.rl.group_fns import reinforce_pp_advantage, reinforce_pp_baseline_advantage


def test_each_token_carries_the_outcome_discounted_from_the_end() -> None:
    assert reinforce_pp_advantage()(reward=1.0, response_ids=[4, 5, 6]) == {
        "advantage": [1.0, 1.0, 1.0]}
    out = reinforce_pp_advantage(gamma=0.5)(reward=2.0, response_ids=[4, 5, 6])
    assert out["advantage"] == pytest.approx([0.5, 1.0, 2.0])
    assert reinforce_pp_advantage()(reward=None, response_ids=[4, 5]) == {
        "advantage": [0.0, 0.0]}
    assert reinforce_pp_advantage()(reward=1.0, response_ids=[]) == {"advantage": []}


def test_the_kl_in_the_reward_is_summed_from_each_token_on() -> None:
    fn = reinforce_pp_advantage(kl_coef=0.1)
    out = fn(reward=1.0, response_ids=[4, 5, 6], logprobs=[-1.0, -2.0, -0.5],
             ref_logprobs=[-1.5, -1.0, -0.5])
    token = [-0.05, 0.1, 1.0]  # -0.1 * (lp - ref), the outcome on the last
    assert out["advantage"] == pytest.approx([sum(token[t:]) for t in range(3)])
    node = Graph("t").map("a", fn, writes=["advantage"])
    assert node.reads == {"reward", "response_ids", "logprobs", "ref_logprobs"}
    assert Graph("t").map("a", reinforce_pp_advantage(), writes=["advantage"]).reads == {
        "reward", "response_ids"}
    with pytest.raises(ValueError, match=r"reinforce_pp_advantage: 2 logprobs and 3 "
                                         r"ref_logprobs for 3 response tokens"):
        fn(reward=1.0, response_ids=[1, 2, 3], logprobs=[0.0] * 2, ref_logprobs=[0.0] * 3)


def test_the_baseline_is_the_groups_mean_reward_over_the_judged() -> None:
    out = reinforce_pp_baseline_advantage()(
        reward=[1.0, 0.0, None, 1.0], response_ids=[[1, 2], [3, 4, 5], [6], [7]])
    third = 1.0 / 3.0
    want = [[third, third], [-2 * third] * 3, [0.0], [third]]
    for got, w in zip(out["advantage"], want, strict=True):
        assert got == pytest.approx(w)
    kl = reinforce_pp_baseline_advantage(kl_coef=1.0)(
        reward=[1.0, 0.0], response_ids=[[1, 2], [3]], logprobs=[[-1.0, -1.0], [-2.0]],
        ref_logprobs=[[-1.5, -1.0], [-1.0]])
    # rewards less their mean 0.5; token KL rewards -(lp - ref): [-0.5, 0] and [1.0]
    assert kl["advantage"][0] == pytest.approx([-0.5 + 0.5, 0.5])
    assert kl["advantage"][1] == pytest.approx([1.0 - 0.5])
    assert Graph("t").group("a", reinforce_pp_baseline_advantage(),
                            writes=["advantage"]).reads == {"reward", "response_ids"}


@pytest.mark.parametrize(("factory", "kwargs", "says"), [
    (reinforce_pp_advantage, {"gamma": 1.5}, "gamma must be in"),
    (reinforce_pp_advantage, {"kl_coef": -0.1}, "kl_coef must be >= 0"),
    (reinforce_pp_baseline_advantage, {"gamma": -1.0}, "gamma must be in"),
])
def test_bad_settings_are_errors_from_the_factory(factory: object, kwargs: dict,
                                                  says: str) -> None:
    with pytest.raises(ValueError, match=says):
        factory(**kwargs)  # type: ignore[operator]


@pytest.mark.parametrize("estimator", ["grpo", "grpo_no_std", "rloo", "reinforce_pp",
                                       "reinforce_pp_baseline"])
def test_the_main_graph_takes_each_estimator(estimator: str) -> None:
    from pathlib import Path

    from pivotflow.graph_check import load_graph

    path = Path(__file__).resolve().parents[2] / "graphs" / "grpo_genrm.py"
    g = load_graph(path, {"estimator": estimator})
    node = g.nodes["advantage"]
    assert node.kind == ("map" if estimator == "reinforce_pp" else "group")
    assert node.fn is not None and estimator.split("_")[0] in node.fn.__name__
