"""Graph files and graph validation: every mistake names the node and the file line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pivotflow.errors import GraphError
from pivotflow.graph import Graph
from pivotflow.graph_check import load_graph, validate
from pivotflow.rl.group_fns import grpo_advantage

ROOT = Path(__file__).resolve().parents[1]

HEADER = """
from pivotflow.graph import Graph
from pivotflow.rl.group_fns import grpo_advantage

def reward(answer, completion, **_):
    return float(answer == completion)
"""


def write_graph(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "g.py"
    path.write_text(HEADER + textwrap.dedent(body))
    return path


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


GOOD = """
g = Graph("t")
g.model("policy", source="builtin:policy")
g.pool("rollout", workers=1)
g.pool("trainer", workers=1)
src = g.source("prompts", task="arithmetic")
gen = g.generate("rollout", model="policy", pool="rollout")
rew = g.map("reward", reward, writes=["reward"])
adv = g.group("advantage", grpo_advantage, writes=["advantage"])
tr = g.train("train", model="policy", pool="trainer")
g.chain(src, gen, rew, adv, tr)
graph = g
"""


def test_shipped_graphs_validate() -> None:
    for name in ("grpo_genrm.py", "grpo_rule.py"):
        graph = load_graph(ROOT / "graphs" / name)
        kinds = [n.kind for n in graph.order()]
        assert kinds[0] == "source" and kinds[-1] == "train"
        assert "generate" in kinds


def test_good_graph_orders_nodes(tmp_path: Path) -> None:
    graph = load_graph(write_graph(tmp_path, GOOD))
    assert [n.name for n in graph.order()] == ["prompts", "rollout", "reward", "advantage",
                                               "train"]
    assert graph.nodes["reward"].reads == {"answer", "completion"}


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write_graph(tmp_path, GOOD + "\ndef broken(:\n")
    with pytest.raises(GraphError, match=rf"{path}:{line_of(path, 'def broken(:')}: syntax"):
        load_graph(path)


def test_runtime_error_in_graph_file_names_line(tmp_path: Path) -> None:
    path = write_graph(tmp_path, GOOD + "\nx = 1 / 0\n")
    with pytest.raises(GraphError, match=rf"{path}:{line_of(path, '1 / 0')}: ZeroDivisionError"):
        load_graph(path)


def test_missing_field_names_node_and_line(tmp_path: Path) -> None:
    body = GOOD.replace('rew = g.map("reward", reward, writes=["reward"])',
                        'rew = g.map("reward", reward, writes=["score"])')
    path = write_graph(tmp_path, body)
    where = f"{path}:{line_of(path, 'grpo_advantage, writes')}"
    with pytest.raises(GraphError, match=rf"node 'advantage' at {where} reads \['reward'\]"):
        load_graph(path)


def test_undeclared_cycle_is_an_error(tmp_path: Path) -> None:
    path = write_graph(tmp_path, GOOD + "\ng.connect(adv, rew)\n")
    with pytest.raises(GraphError, match="cycle .* is not declared"):
        load_graph(path)


def test_unknown_pool_names_node_and_line(tmp_path: Path) -> None:
    body = GOOD.replace('pool="rollout")', 'pool="rolout")')
    path = write_graph(tmp_path, body)
    where = f"{path}:{line_of(path, 'g.generate(')}"
    with pytest.raises(GraphError, match=rf"node 'rollout' at {where} uses pool 'rolout'"):
        load_graph(path)


def test_unknown_model_is_an_error(tmp_path: Path) -> None:
    path = write_graph(tmp_path, GOOD.replace('model="policy", pool="trainer"',
                                              'model="critic", pool="trainer"'))
    with pytest.raises(GraphError, match="uses model 'critic', which is not declared"):
        load_graph(path)


def test_dangling_node(tmp_path: Path) -> None:
    body = GOOD.replace("g.chain(src, gen, rew, adv, tr)",
                        "g.chain(src, gen, rew, adv, tr)\nextra = g.map('x', reward, writes=['y'])")
    path = write_graph(tmp_path, body)
    with pytest.raises(GraphError, match=rf"node 'x' at {path}:\d+ is dangling"):
        load_graph(path)


def test_no_graph_exposed(tmp_path: Path) -> None:
    path = write_graph(tmp_path, GOOD.replace("graph = g", ""))
    with pytest.raises(GraphError, match="defines neither"):
        load_graph(path)


def test_missing_file() -> None:
    with pytest.raises(GraphError, match="does not exist"):
        load_graph("/nonexistent/graph.py")


def test_duplicate_node_name() -> None:
    g = Graph("t")
    g.map("a", grpo_advantage, writes=["advantage"])
    with pytest.raises(GraphError, match="same name"):
        g.map("a", grpo_advantage, writes=["advantage"])


def test_underscore_fields_are_the_controllers_own() -> None:
    # the controller keeps its per-sample state under "_" names; a stage may not write one
    g = Graph("t")
    with pytest.raises(GraphError, match=r"stage 'a' at .*test_graph.py:\d+: field names "
                                         r"'_partial' are not allowed"):
        g.map("a", grpo_advantage, writes=["reward", "_partial"])
    with pytest.raises(GraphError, match="'_x' are not allowed"):
        g.group("b", grpo_advantage, writes=["_x"])


def test_star_args_function_rejected() -> None:
    g = Graph("t")

    def bad(*args: object) -> float:
        return 0.0

    with pytest.raises(GraphError, match="takes \\*args"):
        g.map("a", bad, writes=["reward"])


def test_fan_out_rejected() -> None:
    g = Graph("t")
    g.model("policy", source="builtin:policy")
    g.pool("p", workers=1)
    src = g.source("s", task="arithmetic")
    gen = g.generate("gen", model="policy", pool="p")
    adv = g.group("adv", grpo_advantage, writes=["advantage"])
    tr = g.train("tr", model="policy", pool="p")
    g.chain(src, gen, adv, tr)
    g.connect(src, tr)
    with pytest.raises(GraphError, match="node 's' .* 2 outputs"):
        validate(g)


@pytest.mark.parametrize("kw,error", [
    ({"tools": "nosuch.module:calc"}, "cannot import tool module 'nosuch.module'"),
    ({"tools": "pivotflow.tools.builtin:nothing"}, "has no attribute 'nothing'"),
    ({"tools": []}, "tools= names no tool"),
    ({"tools": "pivotflow.tools.builtin:calculator", "max_turns": 0}, "max_turns must be"),
    ({"tools": "pivotflow.tools.builtin:calculator", "tool_parser": "xml"},
     "unknown tool_parser 'xml'"),
    ({"tools": "pivotflow.tools.builtin:calculator", "tool_pool": {"wrokers": 2}},
     "unknown tool_pool options ['wrokers']"),
])
def test_bad_tool_options_name_the_stage_and_line(kw: dict, error: str) -> None:
    g = Graph("t")
    with pytest.raises(GraphError, match="generate 'gen' at .*test_graph.py:") as info:
        g.generate("gen", model="m", pool="p", **kw)
    assert error in str(info.value)


def test_tools_load_from_paths_and_objects_and_widen_the_fields() -> None:
    from pivotflow.tools.builtin import calculator

    g = Graph("t")
    by_path = g.generate("a", model="m", pool="p",
                         tools="pivotflow.tools.builtin:calculator, pivotflow.tools.builtin")
    assert by_path.options["tools"].names == ["calculator"]  # the same tool twice is one
    by_object = g.generate("b", model="m", pool="p", tools=[calculator], max_turns=2)
    assert by_object.options["tools"].names == ["calculator"]
    assert {"loss_mask", "trajectory", "turns", "tool_calls"} <= by_object.writes
    assert "loss_mask" not in g.generate("c", model="m", pool="p").writes


def test_chat_template_is_a_bool_and_reaches_the_source() -> None:
    g = Graph("g")
    src = g.source("prompts", task="arithmetic", chat_template=True)
    assert src.options["chat_template"] is True and "chat_template" not in \
        src.options["task_options"]  # the task is not handed the knob
    with pytest.raises(GraphError, match=r"source 'p' at .*test_graph.py:\d+: chat_template "
                                         r"must be True or False, got 'yes'"):
        g.source("p", task="arithmetic", chat_template="yes")


def test_a_prompt_file_of_messages_widens_nothing_and_keeps_them(tmp_path: Path) -> None:
    rows = ['{"prompt": [{"role": "user", "content": "1+2="}], "answer": 3, "level": 1}',
            '{"prompt": "2+2=", "answer": 4, "level": 2}']  # strings and messages may mix
    (tmp_path / "p.jsonl").write_text("\n".join(rows) + "\n")
    src = Graph("g").source("prompts", path=str(tmp_path / "p.jsonl"))
    table = src.options["table"]
    assert table.rows[0]["prompt"] == [{"role": "user", "content": "1+2="}]
    assert table.rows[1]["prompt"] == "2+2=" and table.columns == ("level",)


def test_a_kl_penalty_needs_a_reference_stage_upstream(tmp_path: Path) -> None:
    path = write_graph(tmp_path, GOOD.replace('pool="trainer")', 'pool="trainer", kl_coef=0.1)'))
    with pytest.raises(GraphError) as err:
        load_graph(path)
    assert f"g.py:{line_of(path, 'kl_coef=0.1')}" in str(err.value)
    assert "reads ['ref_logprobs'], which no upstream node produces" in str(err.value)
    # with one, on its own pool: the frozen copy of the trained policy
    with_ref = GOOD.replace('pool="trainer")', 'pool="trainer", kl_coef=0.1)').replace(
        "g.chain(src, gen, rew, adv, tr)",
        'g.pool("ref", workers=1)\n'
        'ref = g.reference("reference", model="policy", pool="ref")\n'
        "g.chain(src, gen, ref, rew, adv, tr)")
    graph = load_graph(write_graph(tmp_path, with_ref))
    ref_node = graph.nodes["reference"]
    assert ref_node.writes == {"ref_logprobs"} and "ref_logprobs" in graph.nodes["train"].reads
    assert graph.weights_of(ref_node) == "policy.ref"
    assert graph.weights_of(graph.nodes["rollout"]) == "policy"


def test_a_reference_on_an_untrained_model_uses_it_as_it_is() -> None:
    g = Graph("t")
    g.model("policy", source="builtin:policy")
    g.model("base", source="builtin:policy")
    g.pool("p", workers=1)
    ref = g.reference("reference", model="base", pool="p")
    g.train("train", model="policy", pool="p")
    assert g.weights_of(ref) == "base"


@pytest.mark.parametrize(("kw", "error"), [
    ({"kl_coef": -0.1}, "kl_coef must be a number >= 0, got -0.1"),
    ({"kl_coef": "0.1"}, "Expected `float`, got `str` - at `$.kl_coef`"),
    ({"kl_coef": float("nan")}, "kl_coef must be a number >= 0, got nan"),
    ({"kl_estimator": "k2"}, "kl_estimator must be one of ['k1', 'k3'], got 'k2'"),
    # every trainer knob is typed (worker/train_config.py): a typo is no silent default
    ({"clip_epss": 0.3}, "unknown setting 'clip_epss'; valid: lr, lr_schedule, lr_warmup_steps, "
                         "lr_decay_steps, min_lr_ratio, clip_eps, clip_eps_high, dual_clip, "
                         "aggregation, "),
    ({"aggregation": "mean"}, "aggregation must be one of ['token-mean', "),
    ({"lr": 0, "clip_eps": 1.5}, "lr must be > 0, got 0.0; clip_eps must be in (0, 1), got 1.5"),
    ({"clip_eps_high": 0.0}, "clip_eps_high must be > 0, got 0.0"),
    ({"dual_clip": 1.0}, "dual_clip must be > 1, got 1.0"),
    ({"behavior_weight_cap": -1.0}, "behavior_weight_cap must be > 0, got -1.0"),
    ({"decoupled_loss": "yes"}, "Expected `bool`, got `str` - at `$.decoupled_loss`"),
    ({"clip_eps_high": float("inf")}, "clip_eps_high must be > 0, got inf"),
])
def test_bad_train_settings_name_the_stage_and_line(kw: dict, error: str) -> None:
    g = Graph("t")
    with pytest.raises(GraphError, match=r"train 'train' at .*test_graph\.py:\d+: ") as err:
        g.train("train", model="policy", pool="p", **kw)
    assert error in str(err.value)
