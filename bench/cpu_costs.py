"""The simulator's CPU cost figures, measured on the worker's own code paths.

For ``bench/workloads/cpu_tiny_longtail.toml``: the shipped tiny models of
``graphs/grpo_genrm_longtail.py`` are published to a real parameter store, then driven through
the classes a worker process runs (``GenerateRole``, ``TrainRole``; one torch thread each, as
the workers use), with jobs shaped as the graph's (temperature 1, a seed per job, a forced
length per sequence drawn as the graph's budget stage draws it; the judge reads prompt + whole
response):

* decode: every ``role.step()`` after the first is one point ``(batch, context tokens, s)``;
  least squares fits ``base + per_seq * b + per_ctx * c`` (the simulator's decode step);
* prefill: the first step of a batch (admission + one decode step) minus that decode step:
  per prompt token, and fitted as ``base + per padded token`` per pass (the engine prefills a
  joining batch in passes of similar length, each padded to its longest: pivotflow/batching.py);
* train: ``TrainRole.train`` (micro-batches, backward, AdamW, publishing the weights and the
  optimizer state to the store) per token of 64-sequence batches, with signal and without (all
  advantages 0: forward and publish only); then 2 and 3 trainer processes in a real gloo group
  (the slowest rank's time per token of the whole batch in a standing group, and what a new
  group adds);
* load: building each role from the store; release: releasing it.

Each figure is the median of ``--repeats`` rounds (this machine is shared). Prints one JSON
object (``toml`` holds the lines to paste into the workload file).

    python bench/cpu_costs.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from pivotflow.batching import prefill_shapes
from pivotflow.controller.training import shards
from pivotflow.graph_check import build_graph, graph_defaults, import_graph_file
from pivotflow.params.shm_store import ShmParamStore
from pivotflow.protocol import GenerateJob, TrainSeq, TrainStep
from pivotflow.run_models import prepare_models
from pivotflow.tasks.length_budget import budget_length
from pivotflow.worker.generate_role import GenerateRole
from pivotflow.worker.train_role import TrainRole

ROOT = Path(__file__).resolve().parents[1]
GRAPH = ROOT / "graphs" / "grpo_genrm_longtail.py"
BATCHES = (1, 4, 8, 16, 32, 64)
WORLDS = (1, 2, 3)  # trainer processes in a data-parallel step
LOADS = 5  # role loads timed per round


def fit(points: list[tuple[float, ...]]) -> list[float]:
    """Least squares ``s = base + k1 * x1 + k2 * x2 + ...`` over ``(x1, x2, ..., s)`` points;
    returns ``[base, k1, k2, ...]``, each at least 0 (a negative one is noise, not a cost)."""
    x = torch.tensor([[1.0, *p[:-1]] for p in points], dtype=torch.float64)
    y = torch.tensor([p[-1] for p in points], dtype=torch.float64)
    coef = torch.linalg.lstsq(x, y.unsqueeze(1)).solution.squeeze(1)
    return [max(float(v), 0.0) for v in coef]


def generate_points(role: GenerateRole, prompts: list[list[int]], new: list[int],
                    job0: int) -> tuple[list[tuple[float, float, float]], float]:
    """Runs one batch to the end; returns the decode points and the first step's seconds."""
    jobs = [GenerateJob(job_id=job0 + i, prompt_ids=p, max_tokens=n, min_tokens=n,
                        temperature=1.0, seed=job0 + i)
            for i, (p, n) in enumerate(zip(prompts, new, strict=True))]
    ctx = {j.job_id: len(j.prompt_ids) for j in jobs}
    t0 = time.perf_counter()
    role.add(jobs)
    done = role.step()
    first = time.perf_counter() - t0
    for d in done:
        ctx.pop(d.job_id)
    for k in ctx:
        ctx[k] += 1
    points = []
    while role.has_work():
        b, c = len(ctx), sum(ctx.values())
        t0 = time.perf_counter()
        done = role.step()
        points.append((float(b), float(c), time.perf_counter() - t0))
        for k in ctx:
            ctx[k] += 1
        for d in done:
            ctx.pop(d.job_id)
    return points, first


def generate_options(models: Any, model: str) -> dict[str, Any]:
    """A generate role's options as a run hands them over: the batch the bench measures, and
    the model's folder, where the engine finds its tokenizer (``prepare_models``' ``dirs``)."""
    return {"max_batch": 64, "tokenizer_dir": str(models.dirs[model])}


def measure_generate(store: ShmParamStore, model: str, options: dict[str, Any],
                     prompt_fn: Any, new_fn: Any) -> dict[str, float]:
    loads = []
    for _ in range(LOADS):  # the first is cold (allocations, caches): a median of several
        t0 = time.perf_counter()
        role = GenerateRole(store, model, options)
        loads.append(time.perf_counter() - t0)
        role.release()
    load_s = statistics.median(loads)
    role = GenerateRole(store, model, options)
    points: list[tuple[float, float, float]] = []
    # (batch, prompt tokens, the engine's prefill passes, their padded tokens, first step s)
    firsts: list[tuple[int, int, int, int, float]] = []
    job0 = 0
    for b in BATCHES:
        prompts = [prompt_fn(job0 + i) for i in range(b)]
        pts, first = generate_points(role, prompts, [new_fn(job0 + i) for i in range(b)], job0)
        points += pts
        passes = prefill_shapes([len(p) for p in prompts])
        firsts.append((b, sum(len(p) for p in prompts), len(passes),
                       sum(n * w for n, w in passes), first))
        job0 += b
    base, per_seq, per_ctx = fit(points)
    # a batch's first step is its prefill plus one decode step (b sequences, p + b context)
    prefills = [(n, p, k, w, max(first - (base + per_seq * n + per_ctx * (p + n)), 0.0))
                for n, p, k, w, first in firsts]
    per_token = [pre / p for _, p, _, _, pre in prefills]
    # The engine prefills a joining batch in passes of similar length, each padded to its
    # longest (pivotflow/batching.py): base per pass + per padded token, fitted per pass.
    pre_base, per_padded = fit([(w / k, pre / k) for _, _, k, w, pre in prefills])
    t0 = time.perf_counter()
    role.release()
    release_s = time.perf_counter() - t0
    return {"decode_base_s": base, "decode_per_seq_s": per_seq, "decode_per_ctx_token_s": per_ctx,
            "prefill_per_token_s": statistics.median(per_token), "prefill_base_s": pre_base,
            "prefill_per_padded_token_s": per_padded, "load_s": load_s,
            "release_s": release_s, "points": len(points)}


def train_batches(prompts: list[list[int]], lengths: list[list[int]]) -> list[list[TrainSeq]]:
    """Batches of the graph's shape: a prompt each, responses of ``lengths``, advantages +-1."""
    out = []
    for k, lens in enumerate(lengths):
        rng = random.Random(k)
        out.append([TrainSeq(job_id=i, prompt_ids=prompts[i % len(prompts)],
                             response_ids=[rng.randrange(3, 40) for _ in range(n)],
                             logprobs=[-1.0] * n, versions=[0] * n,
                             advantage=rng.choice((-1.0, 1.0)))
                    for i, n in enumerate(lens)])
    return out


def time_train(root: str, rank: int, world: int, batches: list[list[TrainSeq]],
               options: dict[str, Any], rdv: str) -> tuple[float,
                                                           list[tuple[bool, bool, float, int]]]:
    """Rank ``rank`` of ``world`` trainers takes steps on its shard of each batch: with and
    without signal, each first in a new group (the controller forms one when the pool's
    members change, as colocated and backpressure runs often do) and then again in the same
    group (rendezvous files under ``rdv``, fresh for each call). Returns the role's load seconds
    and ``(signal, new group, seconds, batch tokens)`` per step."""
    store = ShmParamStore(root)
    t0 = time.perf_counter()
    role = TrainRole(store, "policy", options)
    load_s = time.perf_counter() - t0
    out = []
    step = 0
    for seqs in batches:
        part = shards(seqs, world)[rank]
        tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in seqs)
        totals = {"total_tokens": sum(len(s.response_ids) for s in seqs), "total_seqs": len(seqs)}
        for signal in (True, False):  # no advantage anywhere: forward only, no AdamW step
            epoch = step
            for regroup in (True, False):
                path = f"{rdv}-e{epoch}" if world > 1 else ""
                t0 = time.perf_counter()
                role.train(TrainStep(step=step, seqs=part, rank=rank, world=world, epoch=epoch,
                                     rendezvous=path, any_signal=signal, **totals))
                out.append((signal, regroup, time.perf_counter() - t0, tokens))
                step += 1
    role.release()
    return load_s, out


def _rank_main(root: str, rank: int, world: int, batches: list[list[TrainSeq]],
               options: dict[str, Any], rdv: str, q: Any) -> None:
    torch.set_num_threads(1)
    q.put((rank, time_train(root, rank, world, batches, options, rdv)))


def measure_train(root: str, batches: list[list[TrainSeq]], options: dict[str, Any],
                  world: int) -> dict[str, float]:
    """Seconds per batch token of a step on ``world`` trainer processes (the slowest rank's)."""
    rdv = tempfile.mkdtemp(prefix="pivotflow-rdv-") + "/trainers"
    if world == 1:
        ranks = {0: time_train(root, 0, 1, batches, options, rdv)}
    else:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=_rank_main, args=(root, r, world, batches, options, rdv, q))
                 for r in range(world)]
        for p in procs:
            p.start()
        ranks = {}
        while len(ranks) < world:
            try:
                rank, got = q.get(timeout=1.0)
                ranks[rank] = got
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:  # a rank died (its traceback is on stderr): stop, do not wait
                    for p in procs:
                        p.kill()
                    raise SystemExit(f"a trainer rank of {world} exited with {dead[0]}") from None
        for p in procs:
            p.join()
    per_token: dict[bool, list[float]] = {True: [], False: []}
    regroup: list[float] = []
    steps = ranks[0][1]
    for i in range(4, len(steps), 2):  # the first batch (four steps) is the warm-up
        signal, _, _, tokens = steps[i]
        new, same = (max(ranks[r][1][k][2] for r in ranks) for k in (i, i + 1))
        per_token[signal].append(same / tokens)
        regroup.append(new - same)
    if world == 1:
        return {"train_per_token_s": statistics.median(per_token[True]),
                "train_no_signal_per_token_s": statistics.median(per_token[False]),
                "load_s": ranks[0][0]}
    return {f"train_per_token_s_world{world}": statistics.median(per_token[True]),
            f"train_no_signal_per_token_s_world{world}": statistics.median(per_token[False]),
            f"train_regroup_s_world{world}": max(statistics.median(regroup), 0.0)}


def measure(repeats: int) -> dict[str, Any]:
    torch.set_num_threads(1)  # as every worker process runs
    module = import_graph_file(GRAPH)
    knobs = graph_defaults(module)
    graph = build_graph(module)

    def lens(first: int, n: int) -> list[int]:  # samples first.. as the graph's budget stage
        return [budget_length(first + i, knobs["median_tokens"], knobs["p99_ratio"],
                              knobs["max_tokens"]) for i in range(n)]

    rounds: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="pivotflow-costs-") as tmp:
        store = ShmParamStore(Path(tmp) / "store")
        models = prepare_models(graph, store, seed=0, console=False)
        tok_p, tok_j = models.tokenizers["policy"], models.tokenizers["judge"]
        rng = random.Random(0)
        prompts = [tok_p.encode(f"{rng.randrange(10, 100)}+{rng.randrange(10, 100)}=")
                   for _ in range(64)]
        gen_opts, judge_opts = generate_options(models, "policy"), generate_options(models, "judge")
        responses = lens(1, 256)
        for r in range(repeats):
            pol = measure_generate(store, "policy", gen_opts, lambda i: prompts[i % 64],
                                   lambda i: responses[i % 256])
            # The judge reads prompt + response (+ "?") and writes a short verdict.
            jud = measure_generate(
                store, "judge", judge_opts,
                lambda i: tok_j.encode("4+4=") + [5] * responses[i % 256] + tok_j.encode("?"),
                lambda i: 7)
            batches = train_batches(prompts, [lens(1000 + 64 * (5 * r + k), 64)
                                              for k in range(5)])
            train: dict[str, float] = {}
            for world in WORLDS:
                train.update(measure_train(str(store.root), batches, {"lr": knobs["lr"]}, world))
            rounds.append({"policy": pol, "judge": jud, "train": train})
    med = {part: {k: statistics.median(rd[part][k] for rd in rounds) for k in rounds[0][part]}
           for part in ("policy", "judge", "train")}
    return {"rounds": repeats, **med}


def toml_lines(m: dict[str, Any]) -> str:
    keys = ("decode_base_s", "decode_per_seq_s", "decode_per_ctx_token_s", "prefill_per_token_s",
            "prefill_base_s", "prefill_per_padded_token_s", "load_s")
    train = ["train_per_token_s", "train_no_signal_per_token_s"] + [
        f"train{kind}_s_world{w}" for w in WORLDS[1:]
        for kind in ("_per_token", "_no_signal_per_token", "_regroup")]
    lines = ["[policy.measured]", *(f"{k} = {m['policy'][k]:.3g}" for k in keys)]
    lines += [f"{k} = {m['train'][k]:.3g}" for k in train]
    lines += ["", "[judge.measured]", *(f"{k} = {m['judge'][k]:.3g}" for k in keys)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    m = measure(args.repeats)
    print(json.dumps({"bench": "cpu_costs", "graph": GRAPH.name, **m, "toml": toml_lines(m)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
