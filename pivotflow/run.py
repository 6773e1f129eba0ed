"""``pivotflow run``: load a graph, start workers, run the controller, leave the run records."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pivotflow import checkpoints
from pivotflow.assembly import ControllerParts, assemble
from pivotflow.config import (
    RunConfig,
    bad_key,
    colocate_groups,
    parse_overrides,
    resolve,
    valid_keys,
    with_model_engines,
)
from pivotflow.controller.clock import LoopClock
from pivotflow.controller.core import Controller
from pivotflow.controller.snapshot import restore, snapshot
from pivotflow.controller.source import PromptSource
from pivotflow.errors import (
    CheckpointError,
    ConfigError,
    GraphError,
    MetricsError,
)
from pivotflow.graph import Graph
from pivotflow.graph_check import build_graph, graph_defaults, import_graph_file
from pivotflow.launch.chaos import Chaos
from pivotflow.launch.fleet import LauncherFleet
from pivotflow.launch.workers import launcher_summary, open_workers
from pivotflow.metrics import RunRecorder
from pivotflow.params.base import ParamStore
from pivotflow.planner import Planner, make_planner
from pivotflow.resume import (
    Continuation,
    Segment,
    differences,
    fingerprint,
    inherited,
    read_config,
    refuse,
    resume_point,
)
from pivotflow.run_callbacks import RunCallbacks
from pivotflow.run_models import ProblemStream, make_evaluation, prepare_models
from pivotflow.run_records import decisions_by_shift, eval_ends, save_policy_folder, summarize
from pivotflow.run_stop import Interrupt, TermBeforeLoop, with_hint
from pivotflow.sinks import open_sinks, prometheus
from pivotflow.transport.curve import load_controller_keys

log = logging.getLogger("pivotflow.run")


@dataclass
class RunResult:
    out: Path
    summary: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)


def pool_order(graph: Graph) -> list[str]:
    """The graph's pools in pipeline order (of the first stage that uses each)."""
    return list(dict.fromkeys(n.pool for n in graph.order() if n.pool))


def build_planner(cfg: RunConfig, graph: Graph) -> Planner:
    """The run's planner: its name, pool groups (static) and knobs (backpressure) from cfg."""
    return make_planner(cfg.planner, colocate_groups(cfg, pool_order(graph)), cfg.planner_knobs)


def plan_workers(graph: Graph, cfg: RunConfig, total: int | None) -> dict[str, str]:
    """worker id -> pool. ``--workers N`` spreads N over the pools: one each, the rest to the
    model stages in graph order; ``pools.NAME`` overrides win. Only the static planner needs a
    worker in every pool (in every group of ``colocate``: a group's workers start in its first
    pool); the colocated one starts every worker in the first pool."""
    order = pool_order(graph)
    sizes = {p.name: p.workers for p in graph.pools.values()}
    elastic = cfg.planner != "static"
    groups = colocate_groups(cfg, order)  # static: the parts that each need a worker
    if total is not None:
        if total < len(groups) and not elastic:
            raise ConfigError(f"--workers {total}: the graph has {len(groups)} pools (or "
                              "colocate groups) and the static planner needs at least one "
                              "worker in each")
        firsts = [g[0] for g in groups] if cfg.colocate else order
        sizes = dict.fromkeys(sizes, 0)
        gen = [p for p in firsts if p != order[-1]] or firsts
        for i in range(total):
            sizes[firsts[i] if i < len(firsts) else gen[(i - len(firsts)) % len(gen)]] += 1
    sizes.update(cfg.pools)
    if cfg.planner == "colocated":
        sizes = {name: (sum(sizes.values()) if name == order[0] else 0) for name in sizes}
    for group in groups if not elastic else []:
        if sum(sizes.get(p, 0) for p in group) == 0:
            what = f"pool {group[0]!r}" if len(group) == 1 else f"colocate group {'+'.join(group)}"
            raise ConfigError(f"{what} has 0 workers; the static planner needs >= 1")
    if sum(sizes.values()) < 1:
        raise ConfigError("no workers: give --workers N or pools.NAME=N")
    out, k = {}, 0
    for name, n in sizes.items():
        for _ in range(n):
            out[f"w{k}-{name}"] = name
            k += 1
    return out


def run(graph_path: str | Path, *, sets: list[str] | None = None, out: Path | None = None,
        workers: int | None = None, steps: int | None = None, console: Any = None,
        resume: str | None = None, accept_changes: bool = False) -> RunResult:
    """Run a graph file to completion; returns where the records are and the summary.
    ``resume``: a run folder to continue from its newest whole checkpoint, or "auto" (the
    ``out`` folder's if it has one, else a fresh start; without ``out``, the newest run of
    this graph under ``runs/``). A resume takes the earlier run's settings, with ``sets`` and
    ``steps`` on top; one that changes what shapes the checkpoint's state is refused unless
    ``accept_changes`` (see pivotflow.resume). Raises ConfigError for a folder without a
    checkpoint, CheckpointError if every checkpoint in it is damaged."""
    if steps is not None and steps < 0:
        raise ConfigError(f"--steps {steps}: must be >= 1 (0: an evaluation round only, "
                          "with --set eval_every)")
    module = import_graph_file(graph_path)
    defaults = graph_defaults(module)
    given = parse_overrides(sets or [], defaults)
    if steps is not None:
        if "steps" in given:
            raise ConfigError(f"--steps {steps} and --set steps={given['steps']} are both "
                              "given; keep one")
        given["steps"] = steps
    cfg = resolve(given, defaults, graph_engines=True)
    graph = build_graph(module, cfg.graph)
    cfg = with_model_engines(cfg, graph, given)
    out, ckpt, passed_over = resume_point(resume, out, graph.name)
    prev = read_config(out) if ckpt is not None else {}
    cont = Continuation()
    shape: list[str] = []
    changes: list[str] = []
    if ckpt is not None:
        cont = Continuation.of(out, ckpt.step, ckpt.path.name, prev)
        overrides = inherited(prev, given, defaults, list(graph.pools))
        cfg = resolve(overrides, defaults, graph_engines=True)
        graph = build_graph(module, cfg.graph)
        cfg = with_model_engines(cfg, graph, overrides)  # (an earlier run's engine wins)
        if workers is None:
            workers = prev.get("workers_total")
        if cfg.steps <= ckpt.step:
            raise ConfigError(f"--resume {out}: its checkpoint is at step {ckpt.step} and the "
                              f"run's steps is {cfg.steps}; give --steps N above {ckpt.step} "
                              "to extend it")
    for prefix, named in (("pools", cfg.pools), ("engine", cfg.engines),
                          ("tensor_parallel", cfg.tensor_parallels)):
        unknown = sorted(set(named) - set(graph.pools))
        if unknown:
            raise bad_key(f"{prefix}.{unknown[0]}", named[unknown[0]],
                          f"the graph has no pool {unknown[0]!r}",
                          valid_keys(defaults, list(graph.pools)))
    assignments = plan_workers(graph, cfg, workers)
    config = {"graph": str(graph_path), "graph_name": graph.name, "workers": assignments,
              **json.loads(_to_json(cfg)), **fingerprint(graph_path, graph),
              "workers_total": workers}
    if ckpt is not None:
        shape, changes = differences(prev, config)
        if shape and not accept_changes:
            raise refuse(out, shape)
    config["history"] = [*cont.history, cont.entry(cfg, sets or [], changes, shape,
                                                   passed_over)]
    records = out / "metrics.jsonl"
    if ckpt is None and records.is_file() and records.stat().st_size > 0:
        raise ConfigError(f"--out {out} already holds a run's records (metrics.jsonl); pass "
                          f"another --out, or --resume {out} to continue it from its newest "
                          "checkpoint")
    for why in passed_over:  # said before anything starts, and kept in the history
        log.warning("passed over a damaged checkpoint: %s", why)
        if console:
            console.print(f"[yellow]passed over a damaged checkpoint[/]: {why}",
                          highlight=False, soft_wrap=True)
    # bound before anything is written: a port in use is a one-line error that leaves nothing
    # What the run opens is released in reverse order however it ends (the store lives in
    # shared memory: it must go whatever happens).
    with contextlib.ExitStack() as stack:
        listener = (prometheus.bind(cfg.metrics_host, cfg.metrics_port) if cfg.metrics_port
                    else None)
        if listener is not None:
            stack.callback(listener.close)
        out.mkdir(parents=True, exist_ok=True)
        recorder = RunRecorder(out)
        if ckpt is not None:
            recorder.continue_after(ckpt.step)  # the metrics continue the same file
            for path in checkpoints.sweep_temporary(out):
                log.warning("removed %s, left by a checkpoint write that did not finish", path)
        else:
            recorder.write_config(config)  # a resume's waits for its first step (on_step)
        from pivotflow.params.shm_store import ShmParamStore, default_root  # torch: not at import
        root = default_root(f"{out.name}-{os.getpid()}")
        sweep_dead_stores(root.parent)
        store = ShmParamStore(root)
        stack.callback(store.cleanup)
        (root / OWNER_FILE).write_text(str(os.getpid()))
        stack.callback(TermBeforeLoop().restore)
        models = prepare_models(graph, store, console=console,
                                seed=cfg.seed if cfg.models_seed < 0 else cfg.models_seed)
        if ckpt is not None:
            checkpoints.publish(ckpt, graph.order()[-1].model or "", store,
                                critic=graph.critic_model())
        source_node = graph.order()[0]
        problems = ProblemStream(source_node, seed=cfg.seed)
        policy_model = next(n.model for n in graph.order() if n.kind == "generate")
        source = PromptSource(source_node, problems, models.tokenizers[policy_model or ""],
                              steps=cfg.steps, max_staleness=cfg.max_staleness, seed=cfg.seed,
                              tools=graph.prompt_tools())
        seg = Segment(out, str(graph_path), cont, config, ckpt)
        stack.callback(_stop_logging_to, _log_to(seg.log_dir / "controller.log"))
        return asyncio_run(_run_async(graph, cfg, assignments, source, models, store,
                                      recorder, seg, console, listener))


def _stop_logging_to(handler: logging.Handler) -> None:
    logging.getLogger("pivotflow").removeHandler(handler)
    handler.close()


def _log_to(path: Path) -> logging.Handler:
    """The run's log: pivotflow's warnings and errors, with tracebacks (a stage function that
    raised, a loop that failed), in ``logs/controller.log`` beside the workers' logs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("pivotflow").addHandler(handler)
    return handler


OWNER_FILE = "OWNER_PID"  # the controller whose run store this is


def sweep_dead_stores(base: Path) -> list[Path]:
    """Remove run stores whose controller is gone (killed with SIGKILL: it could not clean up,
    and /dev/shm is RAM). Only folders marked with an ``OWNER_PID`` file are touched."""
    removed = []
    for marker in base.glob(f"pivotflow-*/{OWNER_FILE}"):
        try:
            os.kill(int(marker.read_text()), 0)
        except ProcessLookupError:
            shutil.rmtree(marker.parent, ignore_errors=True)
            removed.append(marker.parent)
        except (ValueError, OSError):
            continue  # unreadable marker, or a live process of another user: leave it
    return removed


def asyncio_run(coro: Any) -> Any:
    # only the import is guarded: an ImportError raised inside the run (a user's graph, a
    # missing extra) must surface as itself, not re-run the already-awaited coroutine
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def _to_json(cfg: RunConfig) -> str:
    import msgspec

    return msgspec.json.encode(cfg).decode()


def role_options(graph: Graph, cfg: RunConfig,
                 model_dirs: dict[str, Path] | None = None) -> dict[str, dict[str, Any]]:
    """Each pool's worker options (flat: they travel in AssignRole). Every model stage gets
    ``tokenizer_dir`` (its model's folder: engines decode to match stop strings, and vLLM and
    SGLang load the tokenizer from it), ``dtype`` and ``device``; a trainer, its loss knobs
    (and a decaying learning rate's end, the run's ``steps``, where the graph left it 0)."""
    opts: dict[str, dict[str, Any]] = {}
    critic = graph.critic_model()
    for node in graph.order():
        if not node.pool:
            continue
        folder = str(model_dirs[node.model]) if model_dirs and node.model in model_dirs else ""
        o = cfg.worker_config(node.pool, tokenizer_dir=folder).options()
        if node.options.get("routing_replay"):
            if o["engine"] != "torch":
                # (vLLM 0.32 returns routed experts only from its model runner V2, which
                # needs Triton: not on its CPU build, so never run here; SGLang's: never run)
                raise GraphError(f"generate {node.name!r} at {node.where}: routing_replay "
                                 f"needs the embedded engine on pool {node.pool!r} (its "
                                 f"engine is {o['engine']!r})")
            o["record_routing"] = True
        if node.kind == "train":
            o.update({k: v for k, v in node.options.items()
                      if isinstance(v, (int, float, str, bool)) or (
                          isinstance(v, list) and all(isinstance(x, str) for x in v))})
            if o.get("lr_schedule", "constant") != "constant" and not o.get("lr_decay_steps"):
                o["lr_decay_steps"] = cfg.steps  # a decay spans the run unless told otherwise
            if critic:  # the trainer steps the critic stage's model too
                o["critic_model"] = critic
        opts[node.pool] = o
    return opts


def start_tool_pools(graph: Graph, out: Path | None = None) -> dict[str, Any]:
    """A sandboxed tool pool per generate stage with tools (this process owns them); the run
    folder ``out`` is hidden from the tools even if it lies in a folder they are imported from."""
    from pivotflow.tools.pool import ToolPool

    pools: dict[str, Any] = {}
    hidden = () if out is None else (str(out),)
    try:
        for node in graph.order():
            if node.kind == "generate" and "tools" in node.options:
                pools[node.name] = ToolPool(node.options["tools"], hidden_paths=hidden,
                                            **node.options["tool_pool"])
    except BaseException:
        close_tool_pools(pools)
        raise
    return pools


async def _run_async(graph: Graph, cfg: RunConfig, assignments: dict[str, str],
                     source: PromptSource, models: Any, store: ParamStore,
                     recorder: RunRecorder, seg: Segment, console: Any,
                     listener: Any = None) -> RunResult:
    from pivotflow.live import LiveView

    out, cont = seg.out, seg.cont
    live = LiveView(graph.name, cfg.steps, console=console, enabled=cfg.live)
    train = graph.order()[-1]
    policy = train.model or ""  # the trained model
    checkpointed: dict[str, Any] = {"step": cont.step if seg.ckpt is not None else None,
                                    "error": None}
    # (a run that started from an SFT adapter trains on base + that adapter, which no folder
    # holds, so PEFT's adapter_config could name no base: its checkpoints write policy/ only)
    started_from_adapter = policy in graph.models and graph.models[policy].adapter
    lora = (None if started_from_adapter else
            checkpoints.lora_export(train.options, models.dirs.get(policy)))

    critic_model = graph.critic_model()
    critic = None if critic_model is None else (critic_model, models.dirs.get(critic_model))

    def write_checkpoint() -> None:
        if ctl.version <= (checkpointed["step"] or 0) or checkpointed["error"]:
            return  # nothing new since the one on disk (a resume rewrites none before a step)
        try:
            checkpoints.write(out, policy, store, snapshot(ctl),
                              tokenizer_dir=models.dirs.get(policy), lora=lora, critic=critic)
        except CheckpointError as exc:  # a full disk: stop now, the last whole one stays
            checkpointed["error"] = exc
            ctl.fail(exc)
            return
        checkpointed["step"] = ctl.version

    records = RunCallbacks(cfg, recorder, seg, live, write_checkpoint)
    evaluation = (make_evaluation(graph.order()[0], cfg, source.tok, records.on_eval_round,
                                  after=recorder.evals.last_step, tools=source.tools)
                  if cfg.eval_every else None)

    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    error: BaseException | None = None
    endpoint: prometheus.MetricsEndpoint | None = None
    tool_pools: dict[str, Any] = {}
    # What the run opens is released in reverse order however it ends: the signal handlers
    # first, then the workers, the socket, the tool pools, the metrics endpoint, the sinks.
    async with contextlib.AsyncExitStack() as stack:
        records.sinks = open_sinks(cfg.sinks, out, seg.config,
                                   cont.step if seg.ckpt is not None else None)
        stack.callback(records.sinks.close)
        tool_pools = start_tool_pools(graph, out)
        stack.callback(close_tool_pools, tool_pools)
        tc = cfg.transport_config()
        curve = load_controller_keys(Path(tc.curve_keys)) if tc.curve_keys else None
        lc = cfg.launcher_config()
        transport, launcher = open_workers(lc, tc, curve, seg.log_dir,
                                           len(assignments), f"{out.name}-{os.getpid()}")
        parts = ControllerParts(tokenizers=models.tokenizers, source=source,
                                assignments=assignments,
                                role_options=role_options(graph, cfg, models.dirs),
                                store_dir=str(store.root), planner=build_planner(cfg, graph),
                                on_step=records.on_step, tool_pools=tool_pools,
                                on_samples=records.on_samples if cfg.log_samples else None,
                                evaluation=evaluation)
        machine = assemble(stack, graph, cfg.controller_config(), parts, transport=transport,
                           clock=LoopClock(), fleet=LauncherFleet(launcher, assignments))
        ctl = records.ctl = machine.controller
        if listener is not None:
            endpoint = prometheus.MetricsEndpoint(listener, ctl, lambda: records.last)
            stack.push_async_callback(endpoint.close)
        if seg.ckpt is not None:
            restore(ctl, seg.ckpt.state)
        interrupt = Interrupt(ctl, write_checkpoint)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, interrupt.on_signal, sig.name)
        stack.push_async_callback(_unhook_signals, loop)
        chaos = Chaos(launcher, ctl, cfg.chaos.kill_worker_every_s, cfg.seed,
                      cfg.chaos.kill_worker_every_steps)
        try:
            with live:
                if endpoint is not None:
                    await endpoint.start()
                    url = f"http://{cfg.metrics_host}:{cfg.metrics_port}/metrics"
                    log.info("metrics at %s", url)
                    if console:
                        console.print(f"Prometheus metrics at {url}", highlight=False)
                # chaos and the live view (with flow.jsonl) run beside the controller and the
                # fleet's exit watch, are cancelled when it ends; an error in one stops the run
                await machine.run(chaos.run(), _refresh(live, ctl, records.sample_flow))
        except Exception as exc:  # every stop writes summary.json with why (raised again below)
            error = exc
    wall = time.perf_counter() - started
    # every stop checkpoints what it trained (a finished run too: --resume --steps N extends
    # it); a checkpoint that cannot be taken (a full disk) leaves the last whole one
    write_checkpoint()
    error = error or checkpointed["error"]
    if error is not None and records.resume_without_step():
        # a resume that recorded no step leaves every earlier record as it was
        raise with_hint(error, seg, checkpointed["step"])
    summary = summarize(ctl, records.steps, cont.time_s + wall, error)
    summary.shifts += cont.shifts
    summary.migrations += cont.migrations
    summary.worker_restarts += cont.worker_restarts
    summary.extra["resumed_from_step"] = cont.step if seg.ckpt is not None else None
    summary.extra["segments"] = cont.segment + 1
    summary.extra["worker_pids"] = [p.pid for p in launcher.procs.values()]
    summary.extra["chaos_kills"] = chaos.kills
    summary.extra["chaos_kills_unseen"] = chaos.unseen()
    summary.extra.update(eval_ends(recorder))
    summary.extra["metrics_requests"] = None if endpoint is None else endpoint.requests
    summary.extra.update(launcher_summary(launcher, lc))
    if tool_pools:  # what the tool calls gave, by kind (ok, timeout, parse, ...), all stages
        kinds: dict[str, int] = {}
        for pool in tool_pools.values():
            for kind, n in pool.counters.items():
                kinds[kind] = kinds.get(kind, 0) + n
        summary.extra["tool_results"] = kinds
    try:
        # every shift, timed part by part, and why (a resume's are appended)
        with open(out / "shifts.jsonl", "a" if cont.segment else "w") as f:
            for rec, why in zip(ctl.shifts.done, decisions_by_shift(ctl), strict=False):
                f.write(json.dumps({**rec.as_record(), "planner": why}) + "\n")
        recorder.write_summary(summary)
        if cfg.steps > 0:  # (an evaluation-only run trained nothing: no curves, no new policy)
            recorder.make_plots()
            save_policy_folder(store, graph, out, models.dirs.get(graph.order()[-1].model or ""))
    except (OSError, CheckpointError) as exc:  # a full disk: what was written stays whole
        error = error or MetricsError(f"cannot write the run records in {out}: "
                                      f"{getattr(exc, 'strerror', None) or exc}")
    if error is not None:
        raise with_hint(error, seg, checkpointed["step"])
    return RunResult(out, json.loads((out / "summary.json").read_text()), records.steps)


async def _unhook_signals(loop: asyncio.AbstractEventLoop) -> None:
    """The run's Ctrl-C and SIGTERM handlers go; one that comes while the records are written
    raises, as one before the loop did (run_stop.TermBeforeLoop)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)
    TermBeforeLoop()
    await asyncio.sleep(0)


def close_tool_pools(pools: dict[str, Any]) -> None:
    for pool in pools.values():
        pool.close()


async def _refresh(live: Any, ctl: Controller, sample_flow: Callable[[], None]) -> None:
    """Refresh the live view and sample the pools and queues into flow.jsonl, 4 times a
    second (cheap, and it never raises: it stops itself on a full disk)."""
    while True:
        await asyncio.sleep(0.25)
        live.update_flow(ctl)
        sample_flow()
