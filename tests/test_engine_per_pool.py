"""``--set engine.POOL=KIND``: one pool's workers on another engine than ``engine`` (e.g. vLLM
rollouts with the embedded judge). The settings and the options each pool's workers are given;
the runs themselves are in tests/with_vllm (they need vLLM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pivotflow.config import engine_of, parse_overrides, resolve
from pivotflow.errors import ConfigError
from pivotflow.graph_check import build_graph, graph_defaults, import_graph_file
from pivotflow.run import role_options, run

ROOT = Path(__file__).resolve().parents[1]
GENRM = ROOT / "graphs" / "grpo_genrm.py"


def options(sets: list[str]) -> dict[str, dict]:
    module = import_graph_file(GENRM)
    graph = build_graph(module, graph_defaults(module))
    cfg = resolve(parse_overrides(sets), graph_defaults(module), list(graph.pools))
    return role_options(graph, cfg)


def test_a_pool_takes_its_own_engine_and_the_rest_keep_the_runs() -> None:
    opts = options(["engine.rollout=vllm"])
    assert {p: o["engine"] for p, o in opts.items()} == {
        "rollout": "vllm", "genrm": "torch", "trainer": "torch"}
    opts = options(["engine=vllm", "engine.genrm=torch"])
    assert (opts["rollout"]["engine"], opts["genrm"]["engine"]) == ("vllm", "torch")
    cfg = resolve(parse_overrides(["engine=sglang", "engine.genrm=vllm"]), {})
    assert (engine_of(cfg, "rollout"), engine_of(cfg, "genrm")) == ("sglang", "vllm")
    assert cfg.engines == {"genrm": "vllm"}


@pytest.mark.parametrize(
    ("sets", "match"),
    [
        (["engine.rollout=vllmm"], r"^--set engine\.rollout=vllmm: unknown engine; valid: torch, "),
        (["engine.judge=vllm"], r"^--set engine\.judge=vllm: the graph has no pool 'judge'; "
                                r"valid keys: .*engine\.genrm, engine\.rollout, engine\.trainer"),
        (["engines=vllm"], r"^--set engines=vllm: unknown key; valid keys: .*engine\.genrm"),
    ],
)
def test_a_bad_engine_setting_is_a_one_line_error(sets: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        options(sets)
    assert "\n" not in str(info.value)


def test_a_run_refuses_an_engine_for_a_pool_its_graph_lacks(tmp_path: Path) -> None:
    # run() resolves before it knows the pools, then checks them against the built graph
    with pytest.raises(ConfigError, match=r"^--set engine\.judge=vllm: the graph has no pool 'judge'"):
        run(GENRM, sets=["engine.judge=vllm", "live=false"], out=tmp_path / "out", steps=1,
            console=False)
    assert not (tmp_path / "out").exists()


def test_routing_replay_asks_its_pool_to_record_and_needs_the_embedded_engine() -> None:
    from pivotflow.errors import GraphError

    module = import_graph_file(GENRM)
    graph = build_graph(module, graph_defaults(module))
    rollout = next(n for n in graph.order() if n.kind == "generate")
    rollout.options["routing_replay"] = True  # g.generate(..., routing_replay=True)
    cfg = resolve(parse_overrides([]), graph_defaults(module), list(graph.pools))
    opts = role_options(graph, cfg)
    assert {p for p, o in opts.items() if o.get("record_routing")} == {rollout.pool}
    cfg = resolve(parse_overrides([f"engine.{rollout.pool}=vllm"]), graph_defaults(module),
                  list(graph.pools))
    with pytest.raises(GraphError, match=rf"generate {rollout.name!r} at .*: routing_replay needs "
                       rf"the embedded engine on pool {rollout.pool!r} \(its engine is 'vllm'\)"):
        role_options(graph, cfg)
