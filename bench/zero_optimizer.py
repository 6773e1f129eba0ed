"""What sharding AdamW's state over the trainers (``zero_stage`` 1, ``worker/sharded_adam.py``)
saves and costs: two trainer processes (``--world``) take the same optimizer steps of a
Qwen2.5-0.5B-shaped random model (its widths and 151,936-token vocabulary, ``--layers`` of its
24 layers) under ``zero_stage`` 0 (replicated) and 1, through the train role itself (the
parameter store, the gloo group, the publish of every version with its optimizer state).

``zero1_bf16`` (``--layouts``) holds the model in bf16 (``train_dtype``) with float32 master
weights beside the sharded moments. Per layout, each trainer reports:

* ``optim_state_mib``: the AdamW state it holds (``state_bytes``), the figure a GPU's memory
  would see;
* ``rss_mib`` and ``rss_peak_mib``: the process's resident memory after the last step and its
  high-water mark (rank 0 also maps what it publishes to the shared-memory store; rank 1 is the
  clean figure);
* ``step_s``: the median of the steps after the first (the first forms the group), with
  ``sync_s`` (the group's forming at its first step, with no state yet) inside it;
* ``recut_s``: the sync of one more step in a new epoch (``--recut 1``, the default), as when
  a trainer joins, leaves or is replaced: the group re-forms around a state of ``--steps``
  steps (replicated: rank 0 broadcasts its weights and its whole state; sharded: each rank
  reads its new chunks from the store's copy; before 12-05, rank 0 read the whole state and
  scattered it).

Beside them, computed (not run) for the sizes users bring: each trainer's bytes of float32
weights, gradients and moments for a 0.5B, 7B and 32B policy on 8 trainers, per layout.

    python bench/zero_optimizer.py [--layers 2] [--steps 4] [--seqs 4] [--tokens 64] \\
        [--world 2] [--rounds 2] [--layouts zero0,zero1,zero1_bf16] [--device cuda]

On a GPU (``--device cuda``, what ``bench/gpu_check.py`` runs as its ``zero`` part) every
trainer shares the one device, and ``cuda_peak_mib`` is each one's allocator peak.

The rounds alternate the layouts' order. The last line is one JSON object. ``--plot PNG``
draws each layout's memory and step beside the others' (``--replot JSON PNG``: from a stored
result, without running anything).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# layout -> the trainer's options
LAYOUTS = {"zero0": {"zero_stage": 0}, "zero1": {"zero_stage": 1},
           # the model in bf16, float32 master weights and moments sharded (DeepSpeed's bf16)
           "zero1_bf16": {"zero_stage": 1, "train_dtype": "bfloat16"}}
SIZES_B = {"0.5b": 0.494, "7b": 7.62, "32b": 32.8}  # Qwen2.5's parameter counts, billions


def computed_gib(params_b: float, world: int) -> dict[str, float]:
    """Per trainer: float32 weights (4 B) and gradients (4 B) whole, AdamW's two moments (8 B)
    whole or 1/world of them; or bf16 weights and gradients (2 + 2 B) with float32 masters
    and moments (12 B) 1/world of them."""
    p = params_b * 1e9
    return {"zero0": round(16 * p / 2**30, 1), "zero1": round((8 + 8 / world) * p / 2**30, 1),
            "zero1_bf16": round((4 + 12 / world) * p / 2**30, 1)}


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def trainer(root: str, rank: int, args: argparse.Namespace, layout: str,
            rendezvous: str, out: Any) -> None:
    import torch

    from pivotflow.params.shm_store import ShmParamStore
    from pivotflow.protocol import TrainSeq, TrainStep
    from pivotflow.worker.train_role import TrainRole

    torch.set_num_threads(1)
    role = TrainRole(ShmParamStore(root), "policy",
                     {"lr": 1e-5, "threads": 1, "device": args.device, **LAYOUTS[layout]})
    times, syncs = [], []
    # the last step comes in a new epoch, as when a trainer joins, leaves or is replaced: the
    # group re-forms with a state to re-cut (its sync_s is recut_s, outside the medians)
    for step in range(args.steps + args.recut):
        g = torch.Generator().manual_seed(step * 100 + rank)
        seqs = [TrainSeq(job_id=rank * 1000 + i, prompt_ids=torch.randint(
                    3, 151936, (args.tokens // 2,), generator=g).tolist(),
                    response_ids=torch.randint(3, 151936, (args.tokens // 2,),
                                               generator=g).tolist(),
                    logprobs=[-2.0] * (args.tokens // 2), versions=[step] * (args.tokens // 2),
                    advantage=1.0 if i % 2 else -1.0) for i in range(args.seqs)]
        total = args.seqs * args.world * (args.tokens // 2)
        epoch = 2 if step >= args.steps else 1  # (each group its own rendezvous, as the run's)
        done = role.train(TrainStep(step=step, seqs=seqs, rank=rank, world=args.world, epoch=epoch,
                                    rendezvous=f"{rendezvous}-{epoch}", total_tokens=total,
                                    total_seqs=args.seqs * args.world))
        times.append(done.stats["step_s"])
        syncs.append(done.stats["sync_s"])
    cuda_peak = (torch.cuda.max_memory_allocated() / 2**20 if args.device.startswith("cuda")
                 else 0.0)
    out.put({"rank": rank, "layout": layout, "cuda_peak_mib": cuda_peak,
             "optim_state_mib": role.optim.state_bytes() / 2**20, "rss_mib": rss_mib(),
             "rss_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
             "step_s": (statistics.median(times[1:args.steps]) if args.steps > 1
                        else times[0]),
             "first_step_s": times[0], "sync_s": syncs[0],
             "recut_s": syncs[args.steps] if args.recut else 0.0})
    role.release()


def one_layout(layout: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    from pivotflow.engines.torch.model import Decoder, ModelConfig
    from pivotflow.engines.torch.weights import config_to_hf
    from pivotflow.params.shm_store import ShmParamStore

    cfg = ModelConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                      num_hidden_layers=args.layers, num_attention_heads=14,
                      num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True)
    root = Path(tempfile.mkdtemp(prefix="pf-zero-", dir="/dev/shm"))
    try:
        torch.manual_seed(0)
        ShmParamStore(root).publish("policy", 0, Decoder(cfg).state_dict(),
                                    config_to_hf(cfg, torch.float32))
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        rendezvous = str(root / "rendezvous")
        procs = [ctx.Process(target=trainer, args=(str(root), r, args, layout, rendezvous, q))
                 for r in range(args.world)]
        for p in procs:
            p.start()
        rows = sorted((q.get(timeout=1800) for _ in procs), key=lambda r: r["rank"])
        for p in procs:
            p.join(60)
        return rows
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seqs", type=int, default=4, help="sequences per trainer a step")
    ap.add_argument("--tokens", type=int, default=64, help="per sequence, half of it response")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--recut", type=int, choices=(0, 1), default=1,
                    help="one more step in a new epoch: the group re-forms and re-cuts the "
                         "state (recut_s)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--layouts", default="zero0,zero1", help=f"of {','.join(LAYOUTS)}")
    ap.add_argument("--plot", type=Path, help="a PNG of the result")
    ap.add_argument("--replot", nargs=2, type=Path, metavar=("JSON", "PNG"),
                    help="only draw a stored result")
    ap.add_argument("--device", default="cpu",
                    help="cuda: every trainer on this GPU (gloo over CUDA tensors; "
                         "cuda_peak_mib: the allocator's peak)")
    args = ap.parse_args()
    if args.replot:
        plot(json.loads(args.replot[0].read_text()), args.replot[1])
        return
    order = args.layouts.split(",")
    if unknown := set(order) - set(LAYOUTS) or {"zero0", "zero1"} - set(order):
        ap.error(f"--layouts: give zero0 and zero1 and any of {sorted(LAYOUTS)}, not {unknown}")
    runs: dict[str, list[list[dict[str, Any]]]] = {z: [] for z in order}
    for rnd in range(args.rounds):
        for z in (order if rnd % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            rows = one_layout(z, args)
            runs[z].append(rows)
            print(f"round {rnd} {z}: " + ", ".join(
                f"rank {r['rank']} state {r['optim_state_mib']:.0f} MiB rss "
                f"{r['rss_mib']:.0f} MiB step {r['step_s']:.2f} s" for r in rows)
                + f" ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    layouts = {}
    for z, rounds in runs.items():
        per_rank = []
        for rank in range(args.world):
            rows = [rows[rank] for rows in rounds]
            per_rank.append({k: statistics.median(r[k] for r in rows)
                             for k in ("optim_state_mib", "rss_mib", "rss_peak_mib", "step_s",
                                       "first_step_s", "sync_s", "recut_s", "cuda_peak_mib")})
        layouts[z] = per_rank
    result = {
        "bench": "zero_optimizer", "layers": args.layers, "world": args.world,
        "device": args.device,
        "steps": args.steps, "seqs": args.seqs, "tokens": args.tokens, "rounds": args.rounds,
        "layouts": layouts, **ratios(layouts),
        "computed_gib_per_trainer_of_8": {name: computed_gib(b, 8)
                                          for name, b in SIZES_B.items()},
    }
    if args.plot:
        plot(result, args.plot)
    print(json.dumps(result))


def plot(result: dict[str, Any], path: Path) -> None:
    """Per layout and rank: AdamW's state, resident memory after a step and its peak (left);
    the median step (right)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    layouts = result["layouts"]
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    mem, step = fig.subplots(1, 2, width_ratios=(3, 1))
    names = list(layouts)
    keys = (("optim_state_mib", "AdamW state"), ("rss_mib", "resident after a step"),
            ("rss_peak_mib", "peak resident"))
    width = 0.8 / (len(keys) * 2)
    for k, (key, label) in enumerate(keys):
        for rank in range(2):
            xs = [i + (2 * k + rank - len(keys) + 0.5) * width for i in range(len(names))]
            mem.bar(xs, [layouts[n][rank][key] / 1024 for n in names], width, color=f"C{k}",
                    alpha=1.0 if rank else 0.6, label=f"{label}, rank {rank}")
    top = max(r["rss_peak_mib"] for n in names for r in layouts[n]) / 1024
    mem.set_ylim(0, top * 1.35)  # (room for the legend above the bars)
    mem.set_xticks(range(len(names)), names)
    mem.set_ylabel("GiB a trainer")
    mem.legend(fontsize="x-small", ncols=3, loc="upper right")
    mem.grid(axis="y", alpha=0.3)
    step.bar(names, [max(r["step_s"] for r in layouts[n]) for n in names], color="C3")
    step.set_ylabel("the group's step, s (slower rank)")
    step.tick_params(axis="x", labelrotation=20)
    fig.suptitle(f"two trainers, Qwen2.5-0.5B-shaped, {result['layers']} layers, "
                 f"{result.get('device', 'cpu')}")
    FigureCanvasAgg(fig).print_png(str(path))


def ratios(layouts: dict[str, list[dict[str, float]]]) -> dict[str, float]:
    """Each layout against ``zero0``. ``step_time_ratio`` is rank 0's; the group moves at its
    slowest rank's pace, so ``group_step_time_ratio`` takes each layout's slowest median (a
    rank that publishes nothing still waits in the next step's collectives for rank 0's
    publish)."""
    z0 = layouts["zero0"]

    def group_step(rows: list[dict[str, float]]) -> float:
        return max(r["step_s"] for r in rows)

    out = {}
    for name, prefix in (("zero1", ""), ("zero1_bf16", "bf16_")):
        rows = layouts.get(name)
        if rows is None:
            continue
        out[f"{prefix}optim_state_ratio"] = rows[0]["optim_state_mib"] / z0[0]["optim_state_mib"]
        out[f"{prefix}rss_ratio_rank1"] = rows[-1]["rss_mib"] / z0[-1]["rss_mib"]
        out[f"{prefix}peak_rss_ratio_rank1"] = rows[-1]["rss_peak_mib"] / z0[-1]["rss_peak_mib"]
        # (rank 0 publishes the weights and, replicated, the whole state: its figure moves
        # with how the sharded state reaches the store)
        out[f"{prefix}rss_ratio_rank0"] = rows[0]["rss_mib"] / z0[0]["rss_mib"]
        out[f"{prefix}peak_rss_ratio_rank0"] = rows[0]["rss_peak_mib"] / z0[0]["rss_peak_mib"]
        out[f"{prefix}step_time_ratio"] = rows[0]["step_s"] / z0[0]["step_s"]
        out[f"{prefix}group_step_time_ratio"] = group_step(rows) / group_step(z0)
        if z0[0].get("recut_s"):  # the group's re-cut at a new epoch: its slower rank's
            out[f"{prefix}recut_time_ratio"] = (max(r["recut_s"] for r in rows)
                                                / max(r["recut_s"] for r in z0))
    return out


if __name__ == "__main__":
    main()
