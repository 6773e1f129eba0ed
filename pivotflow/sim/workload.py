"""Workload files: what a simulated cluster runs (models, lengths, batch) and on what hardware.

A workload is a TOML (or JSON) file with the tables ``[workload]``, ``[prompt]``,
``[response]``, ``[policy]``, ``[judge]``, ``[train]`` and ``[hardware]``; ``[policy.measured]``
and ``[judge.measured]`` optionally replace roofline terms by measured ones (calibration).
An optional ``[schedule]`` makes it drift: piecewise-linear points over the policy
version for the response lengths, the verdict length and prompts per step
(``pivotflow/sim/schedule.py``); ``Workload.at(step)`` is the stationary workload of one step.
``bench/workloads/README.md`` documents every key. Every mistake is a ``ConfigError`` naming
the file, the table and the key; unknown keys are errors, not silently ignored.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pivotflow.errors import ConfigError
from pivotflow.sim.schedule import Schedule, parse_schedule
from pivotflow.sim.table import Table

Z99 = 2.3263478740408408  # standard normal quantile at 0.99: p99/median = exp(Z99 * sigma)

# Measured coefficients a model may carry (seconds); each replaces one roofline term.
MEASURED_KEYS = (
    "decode_base_s",
    "decode_per_seq_s",
    "decode_per_ctx_token_s",
    "prefill_per_token_s",
    "prefill_base_s",  # an engine that prefills padded to the longest of each pass (ours):
    "prefill_per_padded_token_s",  # base + per padded token * batch * longest, per pass
    # 1: the engine of the sitting measured prefilled all joiners in one pass (before
    # 2026-12-05); else in passes of similar length (pivotflow/batching.py)
    "prefill_one_pass",
    "train_per_token_s",
    "train_no_signal_per_token_s",  # a step whose advantages are all 0: forward only, no AdamW
    "load_s",
)
# A data-parallel step on N trainers sharing the machine's cores (bench/cpu_costs.py): per token
# of the whole batch in a standing group (all-reduce and rank 0's publish included), and the
# seconds a new group adds (forming it, rank 0 broadcasting the state).
WORLD_KEY = re.compile(
    r"train(_per_token|_no_signal_per_token|_regroup)_s_world([2-9]|[1-9][0-9]+)"
)
LENGTH_DRAWS = ("engine", "budget")


@dataclass(frozen=True, slots=True)
class Lengths:
    """A log-normal token length with a cap: ``median * exp(sigma * N(0,1))``, at most ``cap``."""

    median: int
    p99_over_median: float
    cap: int
    # Who draws a response's length: "engine" (the simulated engine, from the job's seed) or
    # "budget" (a map stage per sample id, as graphs/grpo_genrm_longtail.py's, so a simulated
    # run generates the very lengths the real one does: calibration).
    draw: str = "engine"
    # The share of the log-length's variance a prompt's responses share (0 <= share < 1): a
    # group draws ``sigma sqrt(share) z_group``, each response ``sigma sqrt(1 - share) z_own``
    # more, so every response's own distribution stays the same and only how alike a group's
    # responses are moves. Seer (arXiv:2511.14617) schedules on responses to one prompt having
    # similar lengths; 0 (the default, every shipped workload) draws them independently.
    group_share: float = 0.0

    @property
    def sigma(self) -> float:
        return math.log(self.p99_over_median) / Z99


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model's size and shape (what its cost depends on) and its tensor-parallel degree."""

    name: str
    params_b: float  # all parameters, billions
    active_params_b: float  # parameters used per token (= params_b for a dense model)
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    tp: int  # GPUs one replica needs
    expert_params_b: float = 0.0  # parameters inside routed experts (MoE), billions
    experts: int = 0
    experts_active: int = 0
    measured: dict[str, float] = field(default_factory=dict)

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def kv_bytes_per_token(self) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * 2  # bf16


@dataclass(frozen=True, slots=True)
class Hardware:
    """One GPU's figures and the efficiencies the roofline model applies to them."""

    name: str
    tflops: float  # dense bf16 peak, TFLOP/s
    hbm_tb_s: float
    hbm_gb: float
    mem_util: float  # share of HBM an inference engine may use (vLLM gpu_memory_utilization)
    hbm_eff: float  # achieved / peak bandwidth in decode
    decode_mfu: float
    prefill_mfu: float
    train_mfu: float
    step_overhead_ms: float  # per decode step: scheduling, launches, TP all-reduce latency
    load_gb_s: float  # per GPU, parameter store (host memory) -> GPU
    engine_start_s: float
    release_s: float
    max_seqs: int  # per replica (vLLM max_num_seqs)
    # Cores the workers share (a CPU machine: busy workers beyond it slow each other down in
    # proportion); 0: every worker has its own device, as GPUs do.
    cores: int = 0


@dataclass(frozen=True, slots=True)
class Workload:
    """Everything the simulator needs to run one model group on one cluster size."""

    name: str
    path: str
    gpus: int
    prompts_per_step: int
    group_size: int
    max_staleness: int
    steps: int
    prompt: Lengths
    response: Lengths
    policy: ModelSpec
    judge: ModelSpec
    template_tokens: int
    verdict_tokens: int
    p_yes: float
    train_shard_gpus: int
    optimizer_bytes_per_param: float
    hardware: Hardware
    description: str = ""
    schedule: Schedule | None = None  # drift over steps; None: stationary

    def response_at(self, step: float) -> Lengths:
        """The response lengths of policy version ``step`` (the table's without a schedule)."""
        s, r = self.schedule, self.response
        if s is None:
            return r
        return Lengths(
            int(s.at("response_median_tokens", step, r.median)),
            s.at("response_p99_over_median", step, r.p99_over_median),
            int(s.at("response_cap_tokens", step, r.cap)),
            r.draw,
            r.group_share,
        )

    def verdict_at(self, step: float) -> int:
        s = self.schedule
        return self.verdict_tokens if s is None else int(s.at("verdict_tokens", step,
                                                              self.verdict_tokens))

    def at(self, step: float) -> Workload:
        """The stationary workload of policy version ``step``: its lengths, verdict and batch
        held for the whole run (what a regime of a drifting run is alone)."""
        s = self.schedule
        if s is None:
            return self
        return _replace(
            self,
            response=self.response_at(step),
            verdict_tokens=self.verdict_at(step),
            prompts_per_step=int(s.at("prompts_per_step", step, self.prompts_per_step)),
            schedule=None,
        )

    @property
    def max_response_cap(self) -> int:
        """The longest cap over the run (the generate stage's ``max_tokens``)."""
        s = self.schedule
        return self.response.cap if s is None else int(s.max("response_cap_tokens",
                                                              self.response.cap))

    @property
    def max_verdict_tokens(self) -> int:
        s = self.schedule
        return self.verdict_tokens if s is None else int(s.max("verdict_tokens",
                                                               self.verdict_tokens))

    @property
    def group_gpus(self) -> int:
        """GPUs per simulated worker: the largest TP degree, so any worker can host any role."""
        return max(self.policy.tp, self.judge.tp)

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    def scaled(self, gpus: int) -> Workload:
        """The same workload on ``gpus`` GPUs, prompts per step scaled with the cluster (weak
        scaling, so a bigger cluster is not starved). Raises ConfigError for a bad size."""
        if gpus < MIN_WORKERS * self.group_gpus or gpus % self.group_gpus:
            raise ConfigError(
                f"{self.path}: --gpus {gpus} must be a multiple of the worker "
                f"group ({self.group_gpus} GPUs) with room for {MIN_WORKERS} workers"
            )
        factor = gpus / self.gpus
        prompts = max(1, round(self.prompts_per_step * factor))
        sched = self.schedule
        if sched is not None and "prompts_per_step" in sched.curves:
            curves = dict(sched.curves)
            curves["prompts_per_step"] = curves["prompts_per_step"].scaled(factor)
            sched = Schedule(curves, sched.source)
        return _replace(self, gpus=gpus, prompts_per_step=prompts, schedule=sched)


# one generating and one training; fewer workers than pools need a planner that moves them, or a
# static partition whose parts time-share pools
MIN_WORKERS = 2


def _replace(w: Workload, **kw: Any) -> Workload:
    import dataclasses

    return dataclasses.replace(w, **kw)


def _lengths(t: Table) -> Lengths:
    out = Lengths(
        t.num("median_tokens", integer=True),
        t.num("p99_over_median", lo=1.0, lo_open=False),
        t.num("cap_tokens", integer=True),
        t.text("draw", "engine"),
        t.num("group_share", 0.0, lo=0.0, lo_open=False) if t.name == "response" else 0.0,
    )
    if not out.group_share < 1:
        raise ConfigError(f"{t.path}: [{t.name}] group_share = {out.group_share}: must be in "
                          "[0, 1) (1 would make a group's responses one length)")
    if out.group_share and out.draw != "engine":
        raise ConfigError(f"{t.path}: [{t.name}] group_share needs draw = \"engine\" (a budget "
                          "draws each sample's length on its own)")
    if out.draw not in LENGTH_DRAWS:
        raise ConfigError(f"{t.path}: [{t.name}] draw = {out.draw!r}: one of {list(LENGTH_DRAWS)}")
    if out.cap < out.median:
        raise ConfigError(
            f"{t.path}: [{t.name}] cap_tokens {out.cap} is below median_tokens {out.median}"
        )
    t.done()
    return out


def _model(t: Table, extra: tuple[str, ...] = ()) -> ModelSpec:
    params = t.num("params_b")
    experts = t.num("experts", 0, lo=0, integer=True, lo_open=False)
    spec = ModelSpec(
        name=t.text("name"),
        params_b=params,
        active_params_b=t.num("active_params_b", params, hi=params),
        layers=t.num("layers", integer=True),
        hidden=t.num("hidden", integer=True),
        kv_heads=t.num("kv_heads", integer=True),
        head_dim=t.num("head_dim", integer=True),
        tp=t.num("tp", integer=True, hi=64),
        expert_params_b=t.num("expert_params_b", 0.0, lo=0.0, hi=params, lo_open=False),
        experts=experts,
        experts_active=t.num(
            "experts_active", 0, lo=0, hi=max(experts, 0), integer=True, lo_open=False
        ),
    )
    if spec.moe and (spec.experts_active == 0 or spec.expert_params_b == 0):
        raise ConfigError(
            f"{t.path}: [{t.name}] an MoE model (experts > 0) needs "
            "experts_active and expert_params_b"
        )
    m = t.sub("measured")
    if m is not None:
        for k in m.data:
            if k not in MEASURED_KEYS and not WORLD_KEY.fullmatch(k):
                raise ConfigError(
                    f"{m.path}: [{m.name}] unknown key {k!r}; measured "
                    f"coefficients are {list(MEASURED_KEYS)} and "
                    "train_{per_token,no_signal_per_token,regroup}_s_world<N> (N >= 2)"
                )
            spec.measured[k] = m.num(k, lo=0.0, lo_open=False)
    for k in extra:
        t.used.add(k)
    t.done()
    return spec


def parse_workload(data: dict[str, Any], path: str) -> Workload:
    """A validated ``Workload`` from a parsed file; raises ConfigError naming file and key."""
    top = Table(path, "<top level>", data)
    w = Table(path, "workload", data.get("workload"))
    jt = Table(path, "judge", data.get("judge"))
    tr = Table(path, "train", data.get("train"))
    hw = Table(path, "hardware", data.get("hardware"))
    for key in ("workload", "prompt", "response", "policy", "judge", "train", "hardware",
                "schedule"):
        top.used.add(key)
    top.done()
    hardware = Hardware(
        name=hw.text("name"),
        tflops=hw.num("tflops_bf16"),
        hbm_tb_s=hw.num("hbm_tb_s"),
        hbm_gb=hw.num("hbm_gb"),
        mem_util=hw.num("mem_util", hi=1.0),
        hbm_eff=hw.num("hbm_efficiency", hi=1.0),
        decode_mfu=hw.num("decode_mfu", hi=1.0),
        prefill_mfu=hw.num("prefill_mfu", hi=1.0),
        train_mfu=hw.num("train_mfu", hi=1.0),
        step_overhead_ms=hw.num("step_overhead_ms", lo=0.0, lo_open=False),
        load_gb_s=hw.num("load_gb_s"),
        engine_start_s=hw.num("engine_start_s", lo=0.0, lo_open=False),
        release_s=hw.num("release_s", lo=0.0, lo_open=False),
        max_seqs=hw.num("max_seqs_per_replica", integer=True),
        cores=hw.num("cores", 0, lo=0, integer=True, lo_open=False),
    )
    hw.done()
    wl = Workload(
        name=w.text("name"),
        path=path,
        description=w.text("description", ""),
        gpus=w.num("gpus", integer=True),
        prompts_per_step=w.num("prompts_per_step", integer=True),
        group_size=w.num("group_size", lo=1, integer=True, lo_open=False),
        max_staleness=w.num("max_staleness", 0, lo=0, integer=True, lo_open=False),
        steps=w.num("steps", 10, integer=True),
        prompt=_lengths(Table(path, "prompt", data.get("prompt"))),
        response=_lengths(Table(path, "response", data.get("response"))),
        policy=_model(Table(path, "policy", data.get("policy"))),
        template_tokens=jt.num("template_tokens", 0, lo=0, integer=True, lo_open=False),
        verdict_tokens=jt.num("verdict_tokens", lo=5, integer=True, lo_open=False),
        p_yes=jt.num("p_yes", 0.5, lo=0.0, hi=1.0, lo_open=False),
        judge=_model(jt, ("template_tokens", "verdict_tokens", "p_yes")),
        train_shard_gpus=tr.num("shard_gpus", integer=True),
        optimizer_bytes_per_param=tr.num("optimizer_bytes_per_param", lo=0.0, lo_open=False),
        hardware=hardware,
        schedule=parse_schedule(data.get("schedule"), path),
    )
    tr.done()
    w.done()
    _check_schedule(wl)
    if wl.gpus % wl.group_gpus or wl.gpus < MIN_WORKERS * wl.group_gpus:
        raise ConfigError(
            f"{path}: [workload] gpus = {wl.gpus} must be a multiple of the "
            f"largest tp ({wl.group_gpus}) with room for {MIN_WORKERS} workers"
        )
    for m in (wl.policy, wl.judge):
        if m.weight_bytes / m.tp > hardware.hbm_gb * 1e9 * hardware.mem_util:
            raise ConfigError(
                f"{path}: [{'policy' if m is wl.policy else 'judge'}] tp = "
                f"{m.tp}: {m.params_b}B parameters do not fit on {m.tp} GPU(s) "
                f"of {hardware.hbm_gb} GB"
            )
    return wl


def _check_schedule(wl: Workload) -> None:
    """What no single curve shows: the cap stays at or above the median at every point where
    either bends (both are linear between), and a drifting file draws lengths in the engine."""
    s = wl.schedule
    if s is None:
        return
    if wl.response.draw == "budget" and "prompts_per_step" in s.curves:
        # the budget stage places a sample at step group_id // prompts_per_step, as the real
        # graph (graphs/grpo_genrm_longtail.py) does: that needs a fixed prompts_per_step
        raise ConfigError(
            f"{wl.path}: [schedule] prompts_per_step cannot drift with [response] draw = "
            "\"budget\" (a sample's step is its group id // prompts_per_step)"
        )
    for step in s.breakpoints():
        r = wl.response_at(step)
        if r.cap < r.median:
            raise ConfigError(
                f"{wl.path}: [schedule] at step {step} response_cap_tokens {r.cap} is below "
                f"response_median_tokens {r.median}"
            )


def load_workload_data(path: str | Path, _seen: set[Path] | None = None) -> dict[str, Any]:
    """A workload file's tables as parsed, its ``extends`` resolved (not validated yet)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"workload file {p}: {exc.strerror or exc}") from exc
    try:
        if p.suffix == ".json":
            data = json.loads(raw)
        else:
            import tomllib

            data = tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"workload file {p} cannot be parsed: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"workload file {p}: the top level must be a table")
    base = data.pop("extends", None)
    if base is not None:  # a variant: the base file's tables, with this file's keys over them
        if not isinstance(base, str):
            raise ConfigError(f"{p}: extends must be a file name, not {type(base).__name__}")
        if _seen is not None and p.resolve() in _seen:
            raise ConfigError(f"{p}: extends {base!r} loops back to itself")
        seen = (_seen or set()) | {p.resolve()}
        parent = load_workload_data(p.parent / base, seen)
        data = _merged(parent, data)
    return data


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_workload(path: str | Path) -> Workload:
    """Read and validate a workload file (``.toml`` or ``.json``); ``extends = "FILE"`` (a
    path relative to it) takes every table of FILE, this file's keys replacing FILE's.

    Raises ConfigError naming the file for a missing or unparsable file, and the table and key
    for every invalid or unknown value.
    """
    return parse_workload(load_workload_data(path), str(path))
