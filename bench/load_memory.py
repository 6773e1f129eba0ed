"""Bounded memory under load: many samples through echo workers into a deliberately slow trainer.

prompts -> rollout (echo) -> judge (echo) -> reward (map) -> advantage (group) -> train. The
generate stages do no model work (``engine=echo``); the trainer really trains a policy big enough
that each optimizer step costs far more than producing its batch, so the source is held back by
the admission quota (backpressure) the whole run. The controller runs in this process, so this
process's resident memory (VmRSS) is the controller's; a thread samples it while the run goes.

Reports RSS after warm-up and at the end of the run (before teardown draws plots), the growth and
its least-squares slope per trained sample (extrapolated to 1M samples), the largest number of
groups in flight (checked against ``groups_per_step * (max_staleness + 1)``), the largest queue
depth in metrics.jsonl, and the summary.json ledger. Prints one JSON object on its last line.

    nice -n 5 python bench/load_memory.py [--samples 1000000]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

import pivotflow.run as pf_run
from pivotflow.controller.source import PromptSource
from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.engines.torch.weights import save_checkpoint
from pivotflow.errors import ConfigError
from pivotflow.metrics import read_metrics
from pivotflow.tokenizer import default_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from echo_graph import write_echo_graph  # noqa: E402 - a sibling file, not a package

# The trainer's policy (~0.2M parameters): one optimizer step on a 512-sample batch (loss forward
# and backward, AdamW, publishing weights and optimizer state) takes ~0.23 s of one CPU core, a
# third of what the echo stages could feed it (bench/controller.py: ~7000 samples/s).
POLICY = ModelConfig(
    vocab_size=99,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
)
JUDGE = ModelConfig(
    vocab_size=99,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
)


# Warm-up in seconds of flow: the edges' rate meters keep every event of their last 10 s window
# (~290 B per sample while they fill: 4 events of ~72 B), so they grow for the first 10 s of flow
# (a few MiB at a few thousand samples/s) and then stay flat; that is not growth per sample.
WARMUP_S = 12.0


def rss_mb() -> float:
    """This process's resident set size now, in MiB (Linux ``/proc/self/status`` VmRSS)."""
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise ConfigError("/proc/self/status has no VmRSS line: resident memory cannot be read")


class RssSampler(threading.Thread):
    """Samples (seconds, RSS MiB, steps recorded so far) every ``interval_s`` while a run goes.

    Steps are counted from the lines of ``metrics.jsonl``, read incrementally, so each sample is
    tied to how far the run had got without touching the controller.
    """

    def __init__(self, metrics_path: Path, interval_s: float) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.metrics_path = metrics_path
        self.interval_s = interval_s
        self.samples: list[tuple[float, float, int]] = []
        self._stop_event = threading.Event()
        self._offset = 0
        self._steps = 0

    def _count_steps(self) -> int:
        try:
            with open(self.metrics_path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return 0
        whole = data[: data.rfind(b"\n") + 1]  # a line still being written counts next time
        self._offset += len(whole)
        self._steps += whole.count(b"\n")
        return self._steps

    def run(self) -> None:
        start = time.perf_counter()
        while not self._stop_event.wait(self.interval_s):
            self.samples.append((time.perf_counter() - start, rss_mb(), self._count_steps()))

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


class InFlight:
    """The most groups ever admitted and not yet trained or filtered, seen right after each
    admission (the moment the count is highest)."""

    def __init__(self) -> None:
        self.max_groups = 0
        self.admissions = 0


@contextmanager
def watch_in_flight() -> Iterator[InFlight]:
    """Within the block, ``pivotflow.run.run`` builds its prompt source as a subclass that
    records how many groups are in flight after each admission. The source itself is the real
    one: the subclass only reads the controller's count after the real ``admit`` returns."""
    seen = InFlight()

    class WatchedSource(PromptSource):
        def admit(self, ctl: Any, now: float) -> list[list[Any]]:
            groups = super().admit(ctl, now)
            if groups:
                seen.admissions += 1
                seen.max_groups = max(seen.max_groups, ctl.train_buffer.in_flight())
            return groups

    if getattr(pf_run, "PromptSource", None) is not PromptSource:
        raise ConfigError(
            "pivotflow.run no longer builds its source from "
            "pivotflow.controller.source.PromptSource; update bench/load_memory.py"
        )
    pf_run.PromptSource = WatchedSource  # type: ignore[misc]
    try:
        yield seen
    finally:
        pf_run.PromptSource = PromptSource  # type: ignore[misc]


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs (None with fewer than 2 distinct xs)."""
    return statistics.linear_regression(xs, ys).slope if len(set(xs)) >= 2 else None


def write_models(root: Path, policy: ModelConfig = POLICY) -> dict[str, str]:
    """Random-weight policy and judge checkpoints under ``root``; returns name -> directory."""
    torch.manual_seed(0)
    dirs = {}
    for name, cfg in (("policy", policy), ("judge", JUDGE)):
        save_checkpoint(root / name, cfg, Decoder(cfg).state_dict())
        default_tokenizer().save(root / name)  # a model folder carries its tokenizer
        dirs[name] = str(root / name)
    return dirs


def measure_load(
    root: Path,
    *,
    samples: int,
    group_size: int = 16,
    groups_per_step: int = 32,
    max_staleness: int = 1,
    policy: ModelConfig = POLICY,
    interval_s: float = 0.5,
    warmup_frac: float = 0.1,
    warmup_s: float = WARMUP_S,
    planner: str = "static",
) -> dict[str, Any]:
    """Run the load graph under ``root`` until at least ``samples`` samples are trained.

    RSS readings count from the first one past both ``warmup_frac`` of the steps and
    ``warmup_s`` seconds after the first step. Returns the figures the bench prints (see the module docstring).
    Raises ConfigError for a non-positive size or too few readings after warm-up, and whatever
    ``pivotflow.run.run`` raises if the run fails.
    """
    if min(samples, group_size, groups_per_step) < 1 or max_staleness < 0:
        raise ConfigError(
            f"load bench: samples={samples}, group_size={group_size}, "
            f"groups_per_step={groups_per_step} must be >= 1 and max_staleness="
            f"{max_staleness} >= 0"
        )
    per_step = group_size * groups_per_step
    steps = math.ceil(samples / per_step)
    warmup = max(2, int(steps * warmup_frac))
    if steps <= warmup + 1:
        raise ConfigError(
            f"load bench: {samples} samples make {steps} steps of {per_step}; "
            f"need more than the {warmup + 1} warm-up steps"
        )
    dirs = write_models(root, policy)
    graph = write_echo_graph(root / "graph.py", name="load_memory", policy=Path(dirs["policy"]),
                             judge=Path(dirs["judge"]), group_size=group_size,
                             groups_per_step=groups_per_step)
    out = root / "run"
    sampler = RssSampler(out / "metrics.jsonl", interval_s)
    rss_before = rss_mb()
    sampler.start()
    started = time.perf_counter()
    try:
        with watch_in_flight() as in_flight:
            result = pf_run.run(
                graph,
                out=out,
                steps=steps,
                console=False,
                sets=[
                    "engine=echo",
                    "live=false",
                    f"planner={planner}",
                    "threads_per_worker=1",
                    f"max_staleness={max_staleness}",
                    f"graph.group_size={group_size}",
                    f"graph.groups_per_step={groups_per_step}",
                ],
            )
    finally:
        sampler.stop()
    wall = time.perf_counter() - started
    rss_after_run = rss_mb()
    recs = read_metrics(out / "metrics.jsonl")
    # Flow starts with the first recorded step (worker start-up and model loading come before).
    # Only readings while the run still had steps to do count: the teardown after the last
    # step (plots, checkpoint) is not load, and matplotlib alone is tens of MiB.
    flow_t0 = next((t for t, _, k in sampler.samples if k >= 1), 0.0)
    during = [
        (t, rss, k)
        for t, rss, k in sampler.samples
        if warmup <= k < steps and t >= flow_t0 + warmup_s
    ]
    if len(during) < 2:
        raise ConfigError(
            f"load bench: only {len(during)} RSS readings after warm-up; run more "
            f"samples or lower interval_s ({interval_s})"
        )
    trained_at = [k * per_step for _, _, k in during]
    per_sample = slope([float(x) for x in trained_at], [rss for _, rss, _ in during])
    rss_start, rss_end = during[0][1], during[-1][1]
    measured = trained_at[-1] - trained_at[0]
    post = recs[warmup:]
    post_wall = post[-1]["time_s"] - recs[warmup - 1]["time_s"]
    ledger = result.summary["ledger"]
    bound = groups_per_step * (max_staleness + 1)
    return {
        "bench": "load_memory",
        "samples": ledger["samples_trained"],
        "steps": len(recs),
        "wall_s": wall,
        "samples_per_s": ledger["samples_trained"] / wall,
        "samples_per_s_after_warmup": sum(r["samples"] for r in post) / post_wall,
        # the trainer is the bottleneck when it is busy nearly all the time after warm-up
        "train_step_s_mean": sum(r["train_step_s"] for r in post) / len(post),
        "trainer_busy_frac": sum(r["train_step_s"] for r in post) / post_wall,
        "rss_before_run_mb": rss_before,
        "rss_start_mb": rss_start,
        "rss_end_mb": rss_end,
        "rss_growth_mb": rss_end - rss_start,
        "rss_peak_mb": max(rss for _, rss, k in sampler.samples if k < steps),
        "rss_after_run_mb": rss_after_run,
        "rss_start_at_samples": trained_at[0],
        "rss_measured_over_samples": measured,
        "rss_slope_bytes_per_sample": None if per_sample is None else per_sample * 2**20,
        "rss_growth_per_1m_samples_mb": None if per_sample is None else per_sample * 1e6,
        "rss_readings": len(during),
        # (samples trained, RSS MiB) at up to 21 evenly spaced readings after warm-up
        "rss_timeline": [
            [trained_at[i], round(during[i][1], 2)]
            for i in sorted({round(j * (len(during) - 1) / 20) for j in range(21)})
        ],
        "warmup_steps": warmup,
        "warmup_s": warmup_s,
        "max_queue_depth": max(sum(r["queue_depth"].values()) for r in recs),
        "max_queue_depth_by_edge": {
            e: max(r["queue_depth"].get(e, 0) for r in recs) for e in recs[-1]["queue_depth"]
        },
        "max_groups_in_flight": in_flight.max_groups,
        "groups_in_flight_bound": bound,
        "admissions": in_flight.admissions,
        "samples_per_step_exact": all(r["samples"] == per_step for r in recs),
        "ledger": ledger,
        "samples_admitted": ledger["prompts_in"] * group_size,
        "config": {
            "group_size": group_size,
            "groups_per_step": groups_per_step,
            "max_staleness": max_staleness,
            "planner": planner,
            "policy_params": sum(p.numel() for p in Decoder(policy).parameters()),
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--group-size", type=int, default=16)
    ap.add_argument("--groups-per-step", type=int, default=32)
    ap.add_argument("--max-staleness", type=int, default=1)
    ap.add_argument("--interval-s", type=float, default=1.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="pf-load-") as tmp:
        res = measure_load(
            Path(tmp),
            samples=args.samples,
            group_size=args.group_size,
            groups_per_step=args.groups_per_step,
            max_staleness=args.max_staleness,
            interval_s=args.interval_s,
        )
    res["python"] = sys.version.split()[0]
    print(json.dumps(res))


if __name__ == "__main__":
    main()
