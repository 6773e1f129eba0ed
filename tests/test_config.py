"""`--set` overrides: typed, validated, and every mistake names the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pivotflow.config import parse_overrides, resolve
from pivotflow.errors import ConfigError

DEFAULTS = {"lr": 3e-4, "group_size": 8, "use_std": True}


def test_overrides_are_typed() -> None:
    cfg = resolve(parse_overrides(["steps=5", "graph.lr=0.001", "graph.group_size=4",
                                   "pools.rollout=2", "max_staleness=1"]), DEFAULTS, ["rollout"])
    assert cfg.steps == 5 and cfg.max_staleness == 1
    assert cfg.graph == {"lr": 0.001, "group_size": 4, "use_std": True}
    assert cfg.pools == {"rollout": 2}


def test_int_given_for_float_knob_is_a_float() -> None:
    cfg = resolve(parse_overrides(["graph.lr=1"]), DEFAULTS)
    assert cfg.graph["lr"] == 1.0 and isinstance(cfg.graph["lr"], float)


@pytest.mark.parametrize(
    ("items", "match"),
    [
        (["stepz=3"], r"--set stepz: unknown key; valid keys: .*steps"),
        (["steps=3", "steps=4"], r"--set steps is given twice"),
        (["steps=three"], r"steps"),
        (["graph.lrr=1"], r"--set graph.lrr: the graph has no knob 'lrr'; valid keys: .*graph.lr"),
        (["graph.group_size=big"], r"--set graph.group_size='big': expected int"),
        (["graph.use_std=1"], r"expected true or false"),
        (["pools.judge=2"], r"no pool 'judge'"),
        (["pools.rollout=-1"], r"pool size must be >= 0"),
        (["steps=0"], r"steps=0: must be >= 1"),
        (["planner=magic"], r"unknown planner"),
        (["colocate=rollout"], r"only the static planner takes pool groups"),
        (["chaos.kill_worker_every_steps=-2"], r"chaos.kill_worker_every_steps=-2: must be >= 0"),
        (["chaos.kill_worker_every_s=-1"], r"chaos.kill_worker_every_s=-1.0: must be >= 0"),
        (["noequals"], r"expected KEY=VALUE"),
        (["dtype=int8"], r"--set dtype=int8: unknown dtype; valid: auto, float32, bfloat16, "
                         r"float16, fp32, bf16, fp16"),
        (["device=tpu"], r"--set device=tpu: unknown device; valid: cpu, cuda, cuda:N"),
        (["device=cpu:1"], r"unknown device"),
    ],
)
def test_bad_overrides(items: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        resolve(parse_overrides(items), DEFAULTS, ["rollout"])


def test_dtype_and_device_default_to_the_config_and_cpu() -> None:
    cfg = resolve({}, DEFAULTS)
    assert (cfg.dtype, cfg.device) == ("auto", "cpu")
    for name in ("bf16", "bfloat16", "fp16", "float32"):
        assert resolve(parse_overrides([f"dtype={name}"]), DEFAULTS).dtype == name
    assert resolve(parse_overrides(["device=cuda:1"]), DEFAULTS).device == "cuda:1"


def test_workers_are_told_the_model_folder_dtype_and_device(tmp_path: Path) -> None:
    from pivotflow.graph import Graph
    from pivotflow.rl.group_fns import grpo_advantage
    from pivotflow.run import role_options

    g = Graph("g")
    g.model("policy", source=str(tmp_path))
    g.pool("rollout")
    g.pool("trainer")
    g.chain(g.source("prompts", task="arithmetic"),
            g.generate("rollout", model="policy", pool="rollout"),
            g.map("reward", lambda **_: 1.0, writes=["reward"]),
            g.group("advantage", grpo_advantage, writes=["advantage"]),
            g.train("train", model="policy", pool="trainer", lr=1e-4))
    cfg = resolve(parse_overrides(["dtype=bf16", "device=cuda"]), {})
    opts = role_options(g, cfg, {"policy": tmp_path})
    for pool in ("rollout", "trainer"):
        assert opts[pool]["tokenizer_dir"] == str(tmp_path)
        assert (opts[pool]["dtype"], opts[pool]["device"]) == ("bf16", "cuda")
    assert opts["trainer"]["lr"] == 1e-4 and "tokenizer" not in opts["rollout"]
