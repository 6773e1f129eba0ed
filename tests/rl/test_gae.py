"""GAE over one response (list_math.gae_list) against its sum definition, and the per-sample
stage function gae_advantage built on it."""

from __future__ import annotations

import random

import pytest

from pivotflow.graph import Graph
from pivotflow.rl.group_fns import gae_advantage
from pivotflow.rl.list_math import gae_list


def _naive_gae(rewards: list[float], values: list[float], gamma: float,
               lam: float) -> tuple[list[float], list[float]]:
    """O(T^2) from the definition: A_t = sum_l (gamma lam)^l delta_{t+l}, V_T = 0."""
    n = len(rewards)
    nxt = [*values[1:], 0.0]
    deltas = [rewards[t] + gamma * nxt[t] - values[t] for t in range(n)]
    adv = [sum((gamma * lam) ** (k - t) * deltas[k] for k in range(t, n)) for t in range(n)]
    return adv, [a + v for a, v in zip(adv, values, strict=True)]


def test_hand_worked_three_tokens() -> None:
    # gamma 0.9, lam 0.8 (gamma lam = 0.72); deltas: t2 1 - 0.7 = 0.3,
    # t1 0.9 * 0.7 - 0.6 = 0.03, t0 0.9 * 0.6 - 0.5 = 0.04
    adv, ret = gae_list([0.0, 0.0, 1.0], [0.5, 0.6, 0.7], 0.9, 0.8)
    # A2 = 0.3, A1 = 0.03 + 0.72 * 0.3 = 0.246, A0 = 0.04 + 0.72 * 0.246 = 0.21712
    assert adv == pytest.approx([0.21712, 0.246, 0.3])
    assert ret == pytest.approx([0.71712, 0.846, 1.0])


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (1.0, 0.95), (0.99, 0.95), (0.9, 0.0),
                                            (0.0, 0.5), (0.5, 1.0)])
@pytest.mark.parametrize("seed", range(5))
def test_matches_the_sum_definition_on_random_inputs(seed: int, gamma: float,
                                                     lam: float) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 40)
    rewards = [rng.gauss(0, 1) for _ in range(n)]
    values = [rng.gauss(0, 2) for _ in range(n)]
    want_adv, want_ret = _naive_gae(rewards, values, gamma, lam)
    adv, ret = gae_list(rewards, values, gamma, lam)
    assert adv == pytest.approx(want_adv, rel=1e-9, abs=1e-12)
    assert ret == pytest.approx(want_ret, rel=1e-9, abs=1e-12)


def test_gamma_lam_one_is_the_outcome_less_the_value() -> None:
    # telescoping with V_T = 0: A_t = (sum of rewards from t) - V_t, the return the same for all
    values = [0.3, -0.2, 0.9, 0.4]
    adv, ret = gae_list([0.0, 0.0, 0.0, 2.5], values, 1.0, 1.0)
    assert adv == pytest.approx([2.5 - v for v in values])
    assert ret == pytest.approx([2.5] * 4)


def test_lam_zero_is_the_one_step_td_error() -> None:
    adv, _ = gae_list([0.0, 1.0], [0.5, 0.25], 0.5, 0.0)
    assert adv == pytest.approx([0.5 * 0.25 - 0.5, 1.0 - 0.25])


def test_empty_and_mismatched_lists() -> None:
    assert gae_list([], [], 0.9, 0.9) == ([], [])
    with pytest.raises(ValueError, match="gae_list: 2 rewards for 3 values"):
        gae_list([0.0, 1.0], [0.1, 0.2, 0.3], 1.0, 1.0)


def test_the_stage_puts_the_reward_on_the_last_token() -> None:
    gae = gae_advantage(0.9, 0.8)
    got = gae(reward=1.0, values=[0.5, 0.6, 0.7], response_ids=[11, 12, 13], prompt="ignored")
    assert got["advantage"] == pytest.approx([0.21712, 0.246, 0.3])
    assert got["returns"] == pytest.approx([0.71712, 0.846, 1.0])


def test_the_default_stage_gives_the_outcome_less_each_value() -> None:
    got = gae_advantage()(reward=-1.0, values=[0.2, 0.5, -0.1], response_ids=[1, 2, 3])
    assert got["advantage"] == pytest.approx([-1.2, -1.5, -0.9])
    assert got["returns"] == pytest.approx([-1.0, -1.0, -1.0])


def test_a_failed_judgement_gives_no_advantage_and_its_values_as_returns() -> None:
    got = gae_advantage(0.99, 0.95)(reward=None, values=[0.2, 0.5, -0.1], response_ids=[1, 2, 3])
    assert got == {"advantage": [0.0, 0.0, 0.0], "returns": [0.2, 0.5, -0.1]}


def test_an_empty_response_gives_empty_lists() -> None:
    assert gae_advantage()(reward=1.0, values=[], response_ids=[]) == {"advantage": [],
                                                                      "returns": []}


def test_values_and_response_of_different_lengths_is_an_error() -> None:
    with pytest.raises(ValueError, match="gae_advantage: 2 values for 3 response tokens"):
        gae_advantage()(reward=1.0, values=[0.1, 0.2], response_ids=[1, 2, 3])


@pytest.mark.parametrize(("gamma", "lam", "message"), [
    (-0.1, 1.0, "gamma must be in [0, 1], got -0.1"),
    (1.5, 1.0, "gamma must be in [0, 1], got 1.5"),
    (1.0, 1.01, "lam must be in [0, 1], got 1.01"),
    (1.0, float("nan"), "lam must be in [0, 1], got nan"),
])
def test_bad_gamma_or_lam_is_an_error_from_the_factory(gamma: float, lam: float,
                                                       message: str) -> None:
    with pytest.raises(ValueError, match="gae_advantage: ") as err:
        gae_advantage(gamma, lam)
    assert message in str(err.value)


def test_a_graph_map_stage_reads_reward_values_and_response_ids() -> None:
    node = Graph("t").map("gae", gae_advantage(0.99, 0.95), writes=["advantage", "returns"])
    assert node.reads == {"reward", "values", "response_ids"}
    assert node.fn is not None and node.fn.__name__ == "gae_advantage(0.99, 0.95)"


def test_kl_in_the_reward_charges_each_token_its_k1_estimate() -> None:
    """verl's use_kl_in_reward: token t rewards -beta * (logprob - ref_logprob), the last one
    the outcome too; gamma = lam = 1 makes A_t the rewards to go less V_t."""
    fn = gae_advantage(kl_coef=0.1)
    out = fn(reward=1.0, values=[0.2, 0.1, 0.0], response_ids=[5, 6, 7],
             logprobs=[-1.0, -2.0, -0.5], ref_logprobs=[-1.5, -1.0, -0.5])
    token = [-0.1 * 0.5, -0.1 * -1.0, 1.0 + 0.0]  # -beta * (lp - ref), the outcome on the last
    to_go = [sum(token[t:]) for t in range(3)]
    assert out["advantage"] == pytest.approx([g - v for g, v in zip(to_go, [0.2, 0.1, 0.0], strict=True)])
    assert out["returns"] == pytest.approx(to_go)
    g = Graph("kl")
    node = g.map("gae", fn, writes=["advantage", "returns"])
    assert node.reads == {"reward", "values", "response_ids", "logprobs", "ref_logprobs"}
    assert fn.__name__ == "gae_advantage(1.0, 1.0, kl_coef=0.1)"
    with pytest.raises(ValueError, match=r"2 logprobs and 3 ref_logprobs for 3 response"):
        fn(reward=1.0, values=[0.0] * 3, response_ids=[1, 2, 3], logprobs=[0.0] * 2,
           ref_logprobs=[0.0] * 3)
    with pytest.raises(ValueError, match=r"kl_coef must be >= 0, got -1"):
        gae_advantage(kl_coef=-1)
