"""The run's configuration and the ``--set key=value`` overrides that change it.

Overrides are typed and validated: an unknown key, a duplicate key, or a value of the wrong type
is a ConfigError that names the key and lists the valid ones. ``graph.KEY`` reaches the graph
file's own knobs (its ``DEFAULTS`` dict, passed to ``build(config)``); ``pools.NAME`` resizes a
pool the graph declares; ``engine.POOL`` gives one pool's workers another engine than
``engine`` (e.g. ``--set engine.rollout=vllm``: vLLM rollouts, the embedded judge);
``planner.KEY`` sets a backpressure planner's knob (``BackpressureConfig``).
"""

from __future__ import annotations

import importlib.util
import json
from typing import TYPE_CHECKING, Any

import msgspec

from pivotflow import defaults
from pivotflow.errors import ConfigError
from pivotflow.launch.launcher_config import (
    LAUNCHERS,
    RAY_STRATEGIES,
    WORKER_STARTS,
    LauncherConfig,
    RayConfig,
)
from pivotflow.planner.backpressure import BackpressureConfig
from pivotflow.transport.transport_config import TransportConfig
from pivotflow.worker.worker_config import WorkerConfig

if TYPE_CHECKING:
    from pivotflow.controller.core import ControllerConfig
    from pivotflow.graph import Graph

# What models run in (weights and activations); "auto" is the dtype model's config.json names
# (float32 when it names none). The short names are aliases, as in the engines' own flags.
DTYPES = ("auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16")
DEVICES = ("cpu", "cuda")  # "cuda:N" picks a GPU


class ChaosConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Fault injection (like Ray's chaos tests): SIGKILL a random serving worker every
    ``kill_worker_every_s`` seconds, or after every ``kill_worker_every_steps`` optimizer steps
    (0: never)."""

    kill_worker_every_s: float = 0.0
    kill_worker_every_steps: int = 0


class RunConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything a run can be told from the command line (``--set`` keys)."""

    steps: int = defaults.STEPS
    seed: int = 0
    # the seed the built-in models were bootstrapped with (-1: ``seed``), so runs of several
    # RL seeds can share one set of models (each new one trains for minutes here)
    models_seed: int = -1
    max_staleness: int = defaults.MAX_STALENESS
    # partial rollouts: steps wait only for groups max_staleness makes them, generation in
    # flight at a new version resumes from its prefix on it (pivotflow/controller/partial.py)
    partial_rollout: bool = defaults.PARTIAL_ROLLOUT
    over_sample: float = defaults.OVER_SAMPLE  # with partial_rollout: extra groups in flight, x groups_per_step
    # workers keep each role they leave loaded and take it back without a load (memory for
    # every role a worker held; pivotflow/worker/host.py)
    warm_roles: bool = defaults.WARM_ROLES
    planner: str = "backpressure"
    # backpressure/adaptive only: its knobs (--set planner.KEY=; defaults in the planner's module)
    planner_knobs: BackpressureConfig = msgspec.field(default_factory=BackpressureConfig)
    # static only: pools whose workers time-share them in phases, "a+b" per group, groups
    # comma-separated (e.g. "rollout+genrm": inference workers roll out and judge)
    colocate: str = ""
    threads_per_worker: int = defaults.THREADS_PER_WORKER
    max_batch: int = defaults.MAX_BATCH
    max_jobs_per_frame: int = defaults.MAX_JOBS_PER_FRAME
    heartbeat_s: float = defaults.HEARTBEAT_S
    worker_timeout_s: float = defaults.WORKER_TIMEOUT_S
    engine: str = defaults.ENGINE
    engines: dict[str, str] = {}  # pool -> engine, where not ``engine`` (--set engine.POOL=)
    # tensor parallelism of each vLLM or SGLang pool's engine (the embedded engine has none),
    # and a pool's own (--set tensor_parallel.POOL=); on GPUs it needs as many a worker
    tensor_parallel: int = 1
    tensor_parallels: dict[str, int] = {}
    dtype: str = defaults.DTYPE  # one of DTYPES, for every worker's model
    device: str = defaults.DEVICE  # one of DEVICES, for every worker
    # GPUs a worker holds (a Ray bundle's; the local launcher's CUDA_VISIBLE_DEVICES for each
    # worker): -1, one when device is cuda; k > 1 for a rollout engine's tensor parallelism;
    # 1/n for n workers to a GPU. gpus: the GPU ids the local launcher hands out ("": every
    # one this host has)
    gpus_per_worker: float = -1.0
    gpus: str = ""
    live: bool = True
    results_per_frame: int = defaults.RESULTS_PER_FRAME
    max_worker_restarts: int = defaults.MAX_WORKER_RESTARTS
    checkpoint_every: int = 50  # optimizer steps between checkpoints (0: only on Ctrl-C)
    # evaluation rounds (controller/evaluation.py): the policy on eval_prompts held-out prompts
    # at step 0, every eval_every optimizer steps and the last (0: none), generated at
    # eval_temperature (0: greedy); eval.jsonl holds one line a round
    eval_every: int = 0
    eval_prompts: int = 64
    eval_temperature: float = 0.0
    # samples per held-out prompt (verl's val_kwargs.n): task_accuracy is then their mean
    # (mean@n) and task_pass_at_n the share of prompts with one right; needs a temperature
    eval_samples: int = 1
    endpoint: str = ""  # where the controller binds; "" = a private ipc path
    curve_keys: str = ""  # a key dir (python -m pivotflow.transport.curve keygen DIR)
    chaos: ChaosConfig = msgspec.field(default_factory=ChaosConfig)
    launcher: str = "local"  # one of LAUNCHERS: worker processes on this host, or on Ray
    worker_start: str = "auto"  # one of WORKER_STARTS (the local launcher's)
    ray: RayConfig = msgspec.field(default_factory=RayConfig)
    # samples.jsonl: how many of each step's samples to write (-1: all, 0: none)
    log_samples: int = 4
    sinks: str = ""  # comma-separated metric sinks beside metrics.jsonl: one of SINKS each
    metrics_port: int = 0  # a Prometheus text endpoint for the live controller (0: none)
    metrics_host: str = "127.0.0.1"  # where it listens (loopback unless told otherwise)
    pools: dict[str, int] = {}
    graph: dict[str, Any] = {}

    # The components' own configs, composed from the flat keys above (the names --set and
    # config.json use stay as they are: run records are an interface). Each component takes
    # its typed config; a knob's default lives in pivotflow.defaults.

    def controller_config(self) -> ControllerConfig:
        from pivotflow.controller.core import ControllerConfig  # the controller: not at import

        return ControllerConfig(steps=self.steps, max_staleness=self.max_staleness,
                                heartbeat_s=self.heartbeat_s,
                                worker_timeout_s=self.worker_timeout_s,
                                max_jobs_per_frame=self.max_jobs_per_frame,
                                max_worker_restarts=self.max_worker_restarts,
                                partial_rollout=self.partial_rollout,
                                over_sample=self.over_sample, warm_roles=self.warm_roles)

    def worker_config(self, pool: str, tokenizer_dir: str = "") -> WorkerConfig:
        """What a pool's workers are told in AssignRole (beside a trainer's loss knobs)."""
        return WorkerConfig(threads=self.threads_per_worker, max_batch=self.max_batch,
                            engine=engine_of(self, pool), seed=self.seed,
                            results_per_frame=self.results_per_frame, dtype=self.dtype,
                            device=self.device, tokenizer_dir=tokenizer_dir,
                            tensor_parallel=tensor_parallel_of(self, pool))

    def launcher_config(self) -> LauncherConfig:
        return LauncherConfig(kind=self.launcher, threads=self.threads_per_worker,
                              device=self.device, gpus_per_worker=self.gpus_per_worker,
                              gpus=self.gpus, worker_start=self.worker_start, ray=self.ray)

    def transport_config(self) -> TransportConfig:
        return TransportConfig(endpoint=self.endpoint, curve_keys=self.curve_keys)



def _parse_value(raw: str) -> Any:
    """JSON if it parses (numbers, true/false, null, quoted strings, lists), else the raw text."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def parse_overrides(items: list[str], graph_defaults: dict[str, Any] | None = None,
                    pools: list[str] | None = None) -> dict[str, Any]:
    """``["a=1", "pools.x=2"]`` -> ``{"a": 1, "pools.x": 2}``; raises ConfigError. A key given
    twice (also in two spellings of one knob, e.g. ``planner.hysteresis`` and
    ``planner.backpressure.hysteresis``) lists the valid keys (``graph_defaults``' knobs and
    ``pools``' names among them, when given)."""
    out: dict[str, Any] = {}
    seen: dict[str, str] = {}  # a knob's one spelling -> the item that set it
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        knob = _canonical(key)
        if knob in seen:
            raise bad_key(key, raw, f"given twice (first as {seen[knob]})",
                          valid_keys(graph_defaults or {}, pools))
        seen[knob] = item
        out[key] = _parse_value(raw)
    return out


def bad_key(key: str, value: Any, why: str, valid: list[str] | None = None) -> ConfigError:
    """The one form of every ``--set`` error: the item as given, what is wrong, and for an
    unknown or duplicate key the valid ones."""
    shown = value if isinstance(value, str) else json.dumps(value)
    tail = f"; valid keys: {', '.join(valid)}" if valid is not None else ""
    return ConfigError(f"--set {key}={shown}: {why}{tail}")


# planner.PLANNER.KEY: a knob of the named planner (the adaptive planner is a backpressure one
# and takes its knobs under either name); planner.KEY is the older spelling, still accepted
PLANNER_SECTIONS = ("backpressure", "adaptive")


def _canonical(key: str) -> str:
    """One spelling per knob, for finding a knob given twice."""
    parts = key.split(".")
    if len(parts) == 3 and parts[0] == "planner" and parts[1] in PLANNER_SECTIONS:
        return f"planner.{parts[2]}"
    return key


_NESTED = ("pools", "graph", "chaos", "engines", "tensor_parallels", "ray", "planner_knobs")  # set through KEY.NAME, never whole


def engine_of(cfg: RunConfig, pool: str) -> str:
    """The engine a pool's workers generate with: its own (``engine.POOL``), else ``engine``."""
    return cfg.engines.get(pool, cfg.engine)


def with_model_engines(cfg: RunConfig, graph: Graph, overrides: dict[str, Any]) -> RunConfig:
    """The run's configuration with ``g.model(..., engine=KIND)`` applied: each pool that
    generates with such a model (a rollout or judge stage's) runs that engine, unless the
    overrides name one (``engine``: every pool; ``engine.POOL``: that pool). The command line
    wins over the file, as ``--set graph.KNOB`` does over a graph knob. Raises ConfigError
    where the result asks for tensor parallelism on an engine without it."""
    engines = dict(cfg.engines)
    nodes = [] if "engine" in overrides else graph.nodes.values()  # (--set engine: all pools)
    for node in nodes:
        spec = graph.models.get(node.model or "")
        if (node.kind in ("generate", "judge") and node.pool and spec is not None
                and spec.engine is not None and f"engine.{node.pool}" not in overrides):
            engines[node.pool] = spec.engine
    cfg = msgspec.structs.replace(cfg, engines=engines)
    _check_tensor_parallel(cfg)  # (resolve left it here: graph_engines)
    return cfg


def tensor_parallel_of(cfg: RunConfig, pool: str) -> int:
    """A pool's engine's tensor parallelism: its own, else ``tensor_parallel`` where its
    engine has any (vLLM, SGLang), else 1."""
    if pool in cfg.tensor_parallels:
        return cfg.tensor_parallels[pool]
    return cfg.tensor_parallel if engine_of(cfg, pool) in ("vllm", "sglang") else 1


def valid_keys(graph_defaults: dict[str, Any], pools: list[str] | None) -> list[str]:
    """Every ``--set`` key; ``pools.POOL`` and ``engine.POOL`` stand for each pool's while the
    graph's pools are not known yet."""
    names = ["POOL"] if pools is None else pools
    keys = [k for k in RunConfig.__struct_fields__ if k not in _NESTED]
    keys += [f"chaos.{k}" for k in ChaosConfig.__struct_fields__]
    keys += [f"ray.{k}" for k in RayConfig.__struct_fields__]
    keys += [f"planner.{k}" for k in BackpressureConfig.__struct_fields__]
    keys += [f"planner.{p}.{k}" for p in PLANNER_SECTIONS
             for k in BackpressureConfig.__struct_fields__]
    keys += [f"pools.{p}" for p in names] + [f"engine.{p}" for p in names]
    keys += [f"tensor_parallel.{p}" for p in names]
    keys += [f"graph.{k}" for k in graph_defaults]
    return sorted(keys)


def resolve(overrides: dict[str, Any], graph_defaults: dict[str, Any],
            pools: list[str] | None = None, *, graph_engines: bool = False) -> RunConfig:
    """Apply overrides to the defaults; raises ConfigError naming the bad key.
    ``graph_engines``: the graph's models may still name their pools' engines, so the check
    of tensor parallelism against each pool's engine waits for ``with_model_engines``."""
    top: dict[str, Any] = {}
    graph = dict(graph_defaults)
    pool_sizes: dict[str, int] = {}
    chaos: dict[str, Any] = {}
    engines: dict[str, Any] = {}
    tensor_parallels: dict[str, int] = {}
    ray: dict[str, Any] = {}
    knobs: dict[str, float] = {}
    sections: dict[str, str] = {}  # planner.PLANNER.KEY given: PLANNER -> a key naming it
    for key, value in overrides.items():
        head, _, rest = key.partition(".")
        if head == "graph" and rest:
            if rest not in graph_defaults:
                raise bad_key(key, value, f"the graph has no knob {rest!r}",
                              valid_keys(graph_defaults, pools))
            graph[rest] = _convert(key, value, type(graph_defaults[rest]))
        elif head == "pools" and rest:
            if pools is not None and rest not in pools:
                raise bad_key(key, value, f"the graph has no pool {rest!r}",
                              valid_keys(graph_defaults, pools))
            pool_sizes[rest] = _convert(key, value, int)
            if pool_sizes[rest] < 0:
                raise bad_key(key, value, "a pool size must be >= 0")
        elif head == "chaos" and rest in ChaosConfig.__struct_fields__:
            chaos[rest] = value
        elif head == "ray" and rest in RayConfig.__struct_fields__:
            ray[rest] = value
        elif head == "planner" and _planner_knob(rest) in BackpressureConfig.__struct_fields__:
            knobs[_planner_knob(rest)] = _convert(key, value, float)
            section = rest.partition(".")[0] if "." in rest else None
            if section is not None:
                sections[section] = f"{key}={value}"
        elif head == "engine" and rest:
            if pools is not None and rest not in pools:
                raise bad_key(key, value, f"the graph has no pool {rest!r}",
                              valid_keys(graph_defaults, pools))
            engines[rest] = value
        elif head == "tensor_parallel" and rest:
            if pools is not None and rest not in pools:
                raise bad_key(key, value, f"the graph has no pool {rest!r}",
                              valid_keys(graph_defaults, pools))
            tensor_parallels[rest] = _convert(key, value, int)
        elif key in RunConfig.__struct_fields__ and key not in _NESTED:
            top[key] = value
        else:
            raise bad_key(key, value, "unknown key", valid_keys(graph_defaults, pools))
    try:
        cfg = msgspec.convert({**top, "pools": pool_sizes, "graph": graph, "chaos": chaos,
                               "engines": engines, "tensor_parallels": tensor_parallels,
                               "ray": ray, "planner_knobs": knobs},
                              RunConfig, strict=False)
    except msgspec.ValidationError as exc:  # "Expected `int`, got `str` - at `$.steps`"
        why, _, where = str(exc).partition(" - at ")
        path = where.strip("`").removeprefix("$.")
        key = next((k for k in overrides if k == path or _canonical(k) == path), path)
        raise bad_key(key, overrides.get(key), why) from exc
    from pivotflow.planner import PLANNERS

    if cfg.planner not in PLANNERS:
        raise ConfigError(f"--set planner={cfg.planner}: unknown planner; valid: "
                          f"{', '.join(PLANNERS)}")
    _check_planner_knobs(cfg, knobs, sections)
    if cfg.colocate:
        colocate_groups(cfg, pools)
    for key, kind in [("engine", cfg.engine), *((f"engine.{p}", k) for p, k in cfg.engines.items())]:
        if kind not in defaults.ENGINE_KINDS:
            raise ConfigError(f"--set {key}={kind}: unknown engine; valid: "
                              f"{', '.join(defaults.ENGINE_KINDS)}")
    if not graph_engines:
        _check_tensor_parallel(cfg)
    if cfg.dtype not in DTYPES:
        raise ConfigError(f"--set dtype={cfg.dtype}: unknown dtype; valid: {', '.join(DTYPES)}")
    kind, _, index = cfg.device.partition(":")
    if kind not in DEVICES or (index and (kind != "cuda" or not index.isdigit())):
        raise ConfigError(f"--set device={cfg.device}: unknown device; valid: cpu, cuda, "
                          "cuda:N")
    if cfg.steps == 0 and cfg.eval_every < 1:
        raise ConfigError("steps 0: trains nothing; with --set eval_every=1 it takes one "
                          "evaluation round of the policy and stops (verl's val_only)")
    for name in ("threads_per_worker", "max_batch", "max_jobs_per_frame"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"--set {name}={getattr(cfg, name)}: must be >= 1")
    for name in ("kill_worker_every_s", "kill_worker_every_steps"):
        if getattr(cfg.chaos, name) < 0:
            raise ConfigError(f"--set chaos.{name}={getattr(cfg.chaos, name)}: must be >= 0")
    _check_launcher(cfg)
    _check_records(cfg)
    if cfg.max_staleness < 0:
        raise ConfigError(f"--set max_staleness={cfg.max_staleness}: must be >= 0")
    if cfg.eval_samples < 1 or (cfg.eval_samples > 1 and cfg.eval_temperature == 0):
        raise ConfigError(f"--set eval_samples={cfg.eval_samples}: must be >= 1, and more than "
                          "one sample per prompt needs eval_temperature > 0 (greedy samples "
                          "of a prompt are all the same)")
    if cfg.steps < 0:
        raise ConfigError(f"--set steps={cfg.steps}: must be >= 1")
    if cfg.eval_every < 0 or cfg.eval_prompts < 1 or not 0 <= cfg.eval_temperature < 100:
        raise ConfigError(f"--set eval_every={cfg.eval_every} eval_prompts={cfg.eval_prompts} "
                          f"eval_temperature={cfg.eval_temperature}: eval_every must be >= 0 "
                          "(0: no evaluation), eval_prompts >= 1, eval_temperature in [0, 100)")
    if cfg.over_sample < 0 or (cfg.over_sample and not cfg.partial_rollout):
        raise ConfigError(f"--set over_sample={cfg.over_sample}: must be >= 0, and it needs "
                          "partial_rollout=true (the groups over a step's need are carried)")
    return cfg


def _planner_knob(rest: str) -> str:
    """``backpressure.KEY`` / ``adaptive.KEY`` / ``KEY`` (the older spelling) -> ``KEY``."""
    section, dot, knob = rest.partition(".")
    return knob if dot and section in PLANNER_SECTIONS else rest


def _check_planner_knobs(cfg: RunConfig, given: dict[str, float],
                         sections: dict[str, str] | None = None) -> None:
    """A knob only the backpressure planners read is an error with another planner (it would
    be ignored silently), as is ``planner.adaptive.KEY`` with the backpressure planner; the
    interval must be > 0, the shares and costs >= 0."""
    for section, key in (sections or {}).items():
        if section != cfg.planner and not (section, cfg.planner) == ("backpressure", "adaptive"):
            raise ConfigError(f"--set {key}: a knob of the {section} planner, but planner is "
                              f"{cfg.planner!r} (give --set planner={section}, or drop it)")
    if given and cfg.planner not in ("backpressure", "adaptive"):
        raise ConfigError(f"--set planner.{next(iter(given))}: only the backpressure and adaptive "
                          f"planners have knobs (planner is {cfg.planner!r})")
    for name, value in given.items():
        if value < 0 or (name == "interval_s" and value == 0) or value != value:
            raise ConfigError(f"--set planner.{name}={value}: must be "
                              f"{'> 0' if name == 'interval_s' else '>= 0'}")


def _check_tensor_parallel(cfg: RunConfig) -> None:
    """Tensor parallelism: >= 1, only on a vLLM or SGLang pool, and on GPUs no more than a
    worker holds."""
    served = ("vllm", "sglang")
    given = [("tensor_parallel", cfg.tensor_parallel),
             *((f"tensor_parallel.{p}", n) for p, n in cfg.tensor_parallels.items())]
    for key, n in given:
        if n < 1:
            raise ConfigError(f"--set {key}={n}: must be >= 1")
    for pool, n in cfg.tensor_parallels.items():
        if n > 1 and engine_of(cfg, pool) not in served:
            raise ConfigError(f"--set tensor_parallel.{pool}={n}: pool {pool!r} runs the "
                              f"{engine_of(cfg, pool)} engine, which has no tensor parallelism "
                              f"(--set engine.{pool}=vllm or sglang)")
    uses_global = cfg.engine in served or any(e in served for e in cfg.engines.values())
    need = max([n for _, n in given[1:]] + ([cfg.tensor_parallel] if uses_global else [1]))
    gpus = cfg.launcher_config().worker_gpus()
    if cfg.device.startswith("cuda") and need > gpus:
        raise ConfigError(f"tensor parallelism {need} needs {need} GPUs a worker; "
                          f"gpus_per_worker is {gpus:g} (--set gpus_per_worker={need})")


def _check_launcher(cfg: RunConfig) -> None:
    if cfg.launcher not in LAUNCHERS:
        raise ConfigError(f"--set launcher={cfg.launcher}: unknown launcher; valid: "
                          f"{', '.join(LAUNCHERS)}")
    if cfg.worker_start not in WORKER_STARTS:
        raise ConfigError(f"--set worker_start={cfg.worker_start}: unknown; valid: "
                          f"{', '.join(WORKER_STARTS)}")
    if cfg.ray.strategy not in RAY_STRATEGIES:
        raise ConfigError(f"--set ray.strategy={cfg.ray.strategy}: unknown placement strategy; "
                          f"valid: {', '.join(RAY_STRATEGIES)}")
    if cfg.ray.cpus_per_worker < 0 or cfg.ray.place_timeout_s <= 0:
        bad = "cpus_per_worker" if cfg.ray.cpus_per_worker < 0 else "place_timeout_s"
        raise ConfigError(f"--set ray.{bad}={getattr(cfg.ray, bad)}: must be "
                          f"{'>= 0' if bad == 'cpus_per_worker' else '> 0'}")
    if cfg.gpus_per_worker < 0 and cfg.gpus_per_worker != -1:
        raise ConfigError(f"--set gpus_per_worker={cfg.gpus_per_worker}: must be >= 0 "
                          "(-1: one when device is cuda)")
    if not cfg.ray.address:
        raise ConfigError("--set ray.address=: give 'auto' or the cluster's HOST:PORT")
    if cfg.launcher == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("--set launcher=ray: ray is not installed "
                          "(pip install 'pivotflow[ray]')")


def _check_records(cfg: RunConfig) -> None:
    """The records and sinks keys: a sink's extra must be installed before the run starts."""
    from pivotflow.sinks import check_sinks

    if cfg.log_samples < -1:
        raise ConfigError(f"--set log_samples={cfg.log_samples}: give a count of samples per "
                          "step (0: none, -1: all)")
    check_sinks(cfg.sinks)
    if not 0 <= cfg.metrics_port <= 65535:
        raise ConfigError(f"--set metrics_port={cfg.metrics_port}: a TCP port is 1-65535 "
                          "(0: no endpoint)")


def colocate_groups(cfg: RunConfig, pools: list[str] | None) -> list[tuple[str, ...]]:
    """The pool groups ``--set colocate=...`` names (every pool in one; the unnamed alone);
    raises ConfigError for a planner other than static or a name that is not a pool."""
    from pivotflow.planner import parse_groups

    if not cfg.colocate:
        return [(p,) for p in pools or []]
    if cfg.planner != "static":
        raise ConfigError(f"--set colocate={cfg.colocate}: only the static planner takes pool "
                          f"groups (planner is {cfg.planner!r}; colocated time-shares every "
                          "pool, backpressure moves workers anywhere)")
    if pools is None:
        return []
    try:
        return parse_groups(cfg.colocate, pools)
    except ValueError as exc:
        raise ConfigError(f"--set colocate={cfg.colocate}: {exc}") from None


def _convert(key: str, value: Any, typ: type) -> Any:
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ is bool and not isinstance(value, bool):
        raise ConfigError(f"--set {key}={value!r}: expected true or false")
    try:
        return msgspec.convert(value, typ, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"--set {key}={value!r}: expected {typ.__name__} ({exc})") from exc
