"""`--set` overrides: typed, validated, and every mistake names the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
        (["stepz=3"], r"--set stepz=3: unknown key; valid keys: .*pools.rollout.*steps"),
        (["steps=3", "steps=4"], r"--set steps=4: given twice \(first as steps=3\); valid keys: "),
        (["planner.hysteresis=1", "planner.backpressure.hysteresis=2"],
         r"--set planner.backpressure.hysteresis=2: given twice \(first as planner.hysteresis=1"),
        (["steps=three"], r"--set steps=three: Expected `int`, got `str`"),
        (["planner.adaptive.hysteresis=2"],
         r"--set planner.adaptive.hysteresis=2: a knob of the adaptive planner"),
        (["graph.lrr=1"], r"--set graph.lrr=1: the graph has no knob 'lrr'; valid keys: .*graph.lr"),
        (["graph.group_size=big"], r"--set graph.group_size='big': expected int"),
        (["graph.use_std=1"], r"expected true or false"),
        (["pools.judge=2"], r"--set pools.judge=2: the graph has no pool 'judge'; valid keys: "
                            r".*pools.rollout"),
        (["pools.rollout=-1"], r"pool size must be >= 0"),
        (["steps=0"], r"steps 0: trains nothing; with --set eval_every=1"),
        (["steps=-1"], r"steps=-1: must be >= 1"),
        (["planner=magic"], r"unknown planner"),
        (["colocate=rollout"], r"only the static planner takes pool groups"),
        (["chaos.kill_worker_every_steps=-2"], r"chaos.kill_worker_every_steps=-2: must be >= 0"),
        (["chaos.kill_worker_every_s=-1"], r"chaos.kill_worker_every_s=-1.0: must be >= 0"),
        (["noequals"], r"expected KEY=VALUE"),
        (["dtype=int8"], r"--set dtype=int8: unknown dtype; valid: auto, float32, bfloat16, "
                         r"float16, fp32, bf16, fp16"),
        (["device=tpu"], r"--set device=tpu: unknown device; valid: cpu, cuda, cuda:N"),
        (["device=cpu:1"], r"unknown device"),
        (["tensor_parallel=0"], r"^--set tensor_parallel=0: must be >= 1$"),
        (["tensor_parallel.rollout=2"], r"^--set tensor_parallel.rollout=2: pool 'rollout' runs "
                                        r"the torch engine, which has no tensor parallelism "
                                        r"\(--set engine.rollout=vllm or sglang\)$"),
        (["tensor_parallel.judge=2"], r"the graph has no pool 'judge'; valid keys: "
                                      r".*tensor_parallel.rollout"),
        (["engine=vllm", "tensor_parallel=2", "device=cuda"],
         r"^tensor parallelism 2 needs 2 GPUs a worker; gpus_per_worker is 1 "
         r"\(--set gpus_per_worker=2\)$"),
        (["gpus_per_worker=-2"], r"^--set gpus_per_worker=-2.0: must be >= 0"),
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


def rl_graph(folder: Path, **train_knobs: Any) -> Any:
    """prompts -> rollout -> reward -> advantage -> train on a model in ``folder``."""
    from pivotflow.graph import Graph
    from pivotflow.rl.group_fns import grpo_advantage

    g = Graph("g")
    g.model("policy", source=str(folder))
    g.pool("rollout")
    g.pool("trainer")
    g.chain(g.source("prompts", task="arithmetic"),
            g.generate("rollout", model="policy", pool="rollout"),
            g.map("reward", lambda **_: 1.0, writes=["reward"]),
            g.group("advantage", grpo_advantage, writes=["advantage"]),
            g.train("train", model="policy", pool="trainer", **train_knobs))
    return g


def test_workers_are_told_the_model_folder_dtype_and_device(tmp_path: Path) -> None:
    from pivotflow.run import role_options

    g = rl_graph(tmp_path, lr=1e-4)
    cfg = resolve(parse_overrides(["dtype=bf16", "device=cuda"]), {})
    opts = role_options(g, cfg, {"policy": tmp_path})
    for pool in ("rollout", "trainer"):
        assert opts[pool]["tokenizer_dir"] == str(tmp_path)
        assert (opts[pool]["dtype"], opts[pool]["device"]) == ("bf16", "cuda")
    assert opts["trainer"]["lr"] == 1e-4 and "tokenizer" not in opts["rollout"]


def test_a_trainers_list_knob_reaches_its_workers(tmp_path: Path) -> None:
    """``lora_target_modules`` is a list: it travels in AssignRole like the scalar knobs (it was
    once dropped on the way, and the trainer adapted every layer while the checkpoint's adapter
    config named the graph's few)."""
    import msgspec

    from pivotflow.protocol import AssignRole
    from pivotflow.run import role_options
    from pivotflow.worker.train_config import train_config

    g = rl_graph(tmp_path, lora_rank=4, lora_target_modules=["q_proj", "v_proj"])
    opts = role_options(g, resolve(parse_overrides([]), {}))["trainer"]
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(AssignRole(role="train", model="policy",
                                                                    options=opts)),
                                  type=AssignRole)
    assert train_config(dict(wire.options)).lora_target_modules == ["q_proj", "v_proj"]


def test_a_decay_of_the_learning_rate_spans_the_run_unless_the_graph_says_where_it_ends(
        tmp_path: Path) -> None:
    from pivotflow.run import role_options

    def trainer_options(**knobs: Any) -> dict[str, Any]:
        cfg = resolve(parse_overrides(["steps=30"]), {})
        return role_options(rl_graph(tmp_path, **knobs), cfg)["trainer"]

    assert trainer_options(lr_schedule="cosine")["lr_decay_steps"] == 30
    assert trainer_options(lr_schedule="cosine", lr_decay_steps=12)["lr_decay_steps"] == 12
    assert trainer_options()["lr_decay_steps"] == 0  # constant: nothing to fill in


def test_each_component_gets_its_typed_config_composed_from_the_flat_keys(tmp_path: Path) -> None:
    from pivotflow.worker.train_config import train_config
    from pivotflow.worker.worker_config import worker_config

    cfg = resolve(parse_overrides(["max_batch=8", "threads_per_worker=2", "engine.genrm=vllm",
                                   "steps=7", "worker_timeout_s=9", "device=cuda",
                                   "ray.cpus_per_worker=3", "endpoint=tcp://127.0.0.1:5999"]),
                  DEFAULTS)
    ctl = cfg.controller_config()
    assert (ctl.steps, ctl.worker_timeout_s, ctl.max_staleness) == (7, 9.0, 0)
    rollout, genrm = cfg.worker_config("rollout"), cfg.worker_config("genrm", str(tmp_path))
    assert (rollout.engine, genrm.engine, genrm.max_batch, genrm.threads) == ("torch", "vllm", 8, 2)
    # what AssignRole carries, read back by a role beside a trainer's knobs
    options = {**genrm.options(), "lr": 1e-4}
    assert worker_config(options) == genrm and train_config(options).lr == 1e-4
    assert "tokenizer_dir" not in rollout.options()
    launcher = cfg.launcher_config()
    assert (launcher.kind, launcher.threads, launcher.ray.cpus_per_worker) == ("local", 2, 3.0)
    assert launcher.worker_gpus() == 1.0  # auto: a GPU a worker for cuda workers
    assert cfg.transport_config().endpoint == "tcp://127.0.0.1:5999"


def test_tensor_parallelism_reaches_the_vllm_and_sglang_pools_only() -> None:
    cfg = resolve(parse_overrides(["engine.rollout=vllm", "engine.judge=sglang",
                                   "tensor_parallel=2", "tensor_parallel.judge=4",
                                   "device=cuda", "gpus_per_worker=4"]), DEFAULTS,
                  ["rollout", "judge", "trainer"])
    assert [cfg.worker_config(p).tensor_parallel for p in ("rollout", "judge", "trainer")] == \
        [2, 4, 1]  # the trainer's pool runs the embedded engine: none
    assert cfg.launcher_config().worker_gpus() == 4.0


def test_a_knobs_default_is_the_same_for_the_run_and_the_component() -> None:
    from pivotflow.controller.core import ControllerConfig
    from pivotflow.launch.launcher_config import LauncherConfig
    from pivotflow.worker.worker_config import WorkerConfig

    cfg = resolve({}, DEFAULTS)
    assert cfg.controller_config() == ControllerConfig()
    assert cfg.worker_config("rollout") == WorkerConfig()
    assert cfg.launcher_config() == LauncherConfig()


def test_a_duplicate_before_the_pools_are_known_lists_pools_as_a_pattern() -> None:
    with pytest.raises(ConfigError, match=r"given twice .*graph.lr.*pools.POOL") as info:
        parse_overrides(["pools.rollout=1", "pools.rollout=2"], DEFAULTS)
    assert str(info.value).startswith("--set pools.rollout=2: ")


def test_planner_knobs_by_planner_name_and_the_older_spelling() -> None:
    sectioned = resolve(parse_overrides(["planner.backpressure.cooldown_costs=3"]), DEFAULTS)
    older = resolve(parse_overrides(["planner.cooldown_costs=3"]), DEFAULTS)
    assert sectioned.planner_knobs == older.planner_knobs
    assert sectioned.planner_knobs.cooldown_costs == 3.0
    # the adaptive planner is a backpressure one: it takes either section's knobs
    adaptive = resolve(parse_overrides(["planner=adaptive", "planner.adaptive.hysteresis=0.25",
                                        "planner.backpressure.share_costs=4"]), DEFAULTS)
    assert (adaptive.planner_knobs.hysteresis, adaptive.planner_knobs.share_costs) == (0.25, 4.0)
    with pytest.raises(ConfigError, match=r"--set planner.interval_s=0.0: must be > 0"):
        resolve(parse_overrides(["planner.backpressure.interval_s=0"]), DEFAULTS)


def test_steps_flag_errors_name_the_flag() -> None:
    from pivotflow.run import run

    with pytest.raises(ConfigError, match=r"^--steps -1: must be >= 1 \(0: an evaluation"):
        run("graphs/grpo_rule.py", steps=-1)
    with pytest.raises(ConfigError, match=r"^steps 0: trains nothing; with --set eval_every=1"):
        run("graphs/grpo_rule.py", steps=0)
    with pytest.raises(ConfigError, match=r"^--steps 3 and --set steps=4 are both given"):
        run("graphs/grpo_rule.py", steps=3, sets=["steps=4"])
    with pytest.raises(ConfigError, match=r"^--set steps=4: given twice .*pools.POOL"):
        run("graphs/grpo_rule.py", sets=["steps=3", "steps=4"])


def test_a_config_json_recorded_before_the_sectioned_keys_resumes_to_the_same_settings() -> None:
    """A resume replays config.json's settings as --set keys (resume.inherited): the older
    spellings (planner.KEY, engine.POOL, pools.POOL, ray.KEY) it writes are still accepted."""
    import msgspec

    from pivotflow.resume import inherited

    old = resolve(parse_overrides(["planner.hysteresis=0.25", "pools.rollout=2", "engine.rollout=echo",
                                   "ray.address=10.0.0.1:6379", "partial_rollout=true",
                                   "over_sample=0.5", "graph.lr=0.01"]), DEFAULTS, ["rollout"])
    recorded = msgspec.json.decode(msgspec.json.encode(old))  # as config.json holds it
    again = resolve(inherited(recorded, {}, DEFAULTS, ["rollout"]), DEFAULTS, ["rollout"])
    assert again == old


def test_models_seed_lets_another_rl_seed_share_the_built_in_models(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """seed=1 would bootstrap models of its own (minutes of training); models_seed=0 takes the
    shipped seed-0 ones into an empty cache and trains nothing."""
    from pivotflow.run import run

    monkeypatch.setenv("PIVOTFLOW_CACHE", str(tmp_path / "cache"))
    graph = Path(__file__).resolve().parents[1] / "graphs" / "grpo_rule.py"
    result = run(graph, sets=["live=false", "seed=1", "models_seed=0", "graph.groups_per_step=2",
                              "graph.group_size=4"], out=tmp_path / "out", steps=1, console=False)
    assert result.summary["steps"] == 1
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()
                  if not p.name.startswith(".")) == ["models-v3-seed0"]


def _genrm_graph(policy_engine: str | None, judge_engine: str | None) -> Any:
    from pivotflow.graph_check import load_graph

    graph = load_graph(Path(__file__).parents[1] / "graphs" / "grpo_genrm.py")
    graph.models["policy"].engine = policy_engine
    graph.models["judge"].engine = judge_engine
    return graph


def test_a_models_engine_is_what_its_generating_pools_run_unless_the_command_line_says() -> None:
    from pivotflow.config import engine_of, with_model_engines

    graph = _genrm_graph(None, "vllm")  # g.model("judge", ..., engine="vllm")
    given = parse_overrides([])
    cfg = with_model_engines(resolve(given, {}), graph, given)
    assert [engine_of(cfg, p) for p in ("rollout", "genrm")] == ["torch", "vllm"]
    assert cfg.worker_config("genrm").engine == "vllm"  # what the pool's workers are told
    assert cfg.worker_config("trainer").engine == "torch"  # (a train pool generates nothing)
    for sets, want in ((["engine=sglang"], ["sglang", "sglang"]),  # the whole run's
                       (["engine.genrm=torch"], ["torch", "torch"]),  # that pool's
                       (["engine.rollout=vllm"], ["vllm", "vllm"])):
        given = parse_overrides(sets)
        cfg = with_model_engines(resolve(given, {}), graph, given)
        assert [engine_of(cfg, p) for p in ("rollout", "genrm")] == want, sets
    # tensor parallelism is checked against the engine the file names ...
    graph = _genrm_graph(None, "vllm")
    given = parse_overrides(["tensor_parallel.genrm=2"])
    cfg = with_model_engines(resolve(given, {}, graph_engines=True), graph, given)
    assert (engine_of(cfg, "genrm"), cfg.tensor_parallels) == ("vllm", {"genrm": 2})
    # ... and one the file does not name is still refused
    given = parse_overrides(["tensor_parallel.rollout=2"])
    with pytest.raises(ConfigError, match=r"tensor_parallel\.rollout=2: pool 'rollout' runs "
                                          r"the torch engine, which has no tensor parallelism"):
        with_model_engines(resolve(given, {}, graph_engines=True), graph, given)


def test_an_unknown_engine_in_a_graph_file_is_one_line_naming_the_model_and_line() -> None:
    from pivotflow.errors import GraphError
    from pivotflow.graph import Graph

    with pytest.raises(GraphError) as err:
        Graph("x").model("policy", source="builtin:policy", engine="vlm")
    msg = str(err.value)
    assert "\n" not in msg and "model 'policy' at " in msg and "test_config.py:" in msg
    assert "unknown engine 'vlm'; valid: torch, vllm, sglang, echo" in msg
    described = _genrm_graph(None, "vllm").describe()
    assert "judge=builtin:judge (engine vllm)" in described
    assert "policy=builtin:policy," in described  # (none named: the run's)
