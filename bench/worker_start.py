"""Worker start: forked from the local launcher's zygote against exec'd afresh, side by side.

    python bench/worker_start.py [--workers 3] [--repeats 3] [--steps 4] [--device cpu|cuda]
                                 [--out FILE]

1. Hello: ``--workers`` workers started by LocalLauncher with ``fork`` off (exec: each its own
   ``python -m pivotflow.worker``) and on (the zygote imports torch once and forks them), until
   each said Hello to a controller socket (``hello_s``; the zygote's own start is in fork's);
   then one more, as a dead worker's replacement is started mid-run (``replacement_hello_s``);
   then a Shutdown to all and the time until every process exited (``exit_s``). ``cpu_s``: the
   CPU seconds all of it took in child processes (the zygote's and its workers' included).
2. A run: graphs/grpo_genrm.py for ``--steps`` steps with ``worker_start=exec`` and ``fork``:
   the first step's time from the run's start, its wall time, the child processes' CPU seconds,
   and its ledger (lost and duplicates must be 0). ``--device cuda`` runs it on the GPU (the
   local launcher's slots, a GPU a worker), where forked workers have not run before:
   ``bench/gpu_check.py``'s ``fork`` part is this with one repeat.

The modes alternate, ``--repeats`` times each; medians are reported, with fork/exec ratios. The
bound beside them: one worker's imports alone (``one_import_s``, a fresh interpreter importing
what a worker imports before its Hello), the least a cold start can take either way; exec's
cold start pays it once per worker over the host's cores, fork's once. The last line is one
JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GRAPH = ROOT / "graphs" / "grpo_genrm.py"


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def one_import_s() -> float:
    """Wall seconds from starting a fresh interpreter to its having imported what a worker
    imports before its Hello (its exit not counted)."""
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", "from pivotflow.worker.main import warm_torch; "
                           "warm_torch(); import time; print(time.monotonic())"],
                          check=True, capture_output=True, text=True).stdout
    return float(done.strip().splitlines()[-1]) - t0


async def hellos(fork: bool, n: int) -> dict[str, float]:
    """Start ``n`` workers, then a replacement, then shut them down: seconds of each part."""
    from pivotflow.launch.local import LocalLauncher
    from pivotflow.protocol import PROTOCOL_VERSION, Hello, Shutdown, Welcome
    from pivotflow.transport.zmq_transport import ZmqControllerTransport

    transport = ZmqControllerTransport("tcp://127.0.0.1:*")
    seen: dict[str, float] = {}
    store = tempfile.mkdtemp(prefix="pivotflow-bench-store-")

    def on_msg(wid: str, msg: Any) -> None:
        if isinstance(msg, Hello) and wid not in seen:
            seen[wid] = time.perf_counter()
            transport.send(wid, Welcome(protocol_version=PROTOCOL_VERSION, store_dir=store))

    async def until(count: int) -> None:
        deadline = time.monotonic() + 300
        while len(seen) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert len(seen) >= count, f"{count - len(seen)} workers never said Hello"

    transport.start(on_msg)
    cpu0 = children_cpu()
    launcher = LocalLauncher(transport.endpoint,
                             Path(tempfile.mkdtemp(prefix="pivotflow-bench-logs-")), fork=fork)
    try:
        t0 = time.perf_counter()
        for i in range(n):
            launcher.start(f"w{i}")
        await until(n)
        cold = time.perf_counter() - t0
        t1 = time.perf_counter()
        launcher.start(f"w0~r{n}")
        await until(n + 1)
        replacement = time.perf_counter() - t1
        t2 = time.perf_counter()
        for wid in seen:
            transport.send(wid, Shutdown())
        for p in launcher.procs.values():
            p.wait(60)
        exit_s = time.perf_counter() - t2
    finally:
        launcher.stop()
        transport.close()
    return {"hello_s": cold, "replacement_hello_s": replacement, "exit_s": exit_s,
            "cpu_s": children_cpu() - cpu0}


def a_run(mode: str, steps: int, device: str) -> dict[str, float]:
    from pivotflow.run import run

    out = Path(tempfile.mkdtemp(prefix=f"pivotflow-bench-start-{mode}-"))
    cpu0 = children_cpu()
    t0 = time.perf_counter()
    result = run(GRAPH, sets=["live=false", f"worker_start={mode}", f"device={device}"],
                 out=out / "run", steps=steps, console=False)
    wall = time.perf_counter() - t0
    first = json.loads((result.out / "metrics.jsonl").read_text().splitlines()[0])
    ledger = result.summary["ledger"]
    return {"first_step_s": first["time_s"], "run_s": wall, "cpu_s": children_cpu() - cpu0,
            "lost": ledger["lost"], "duplicates": ledger["duplicates"]}


def median_of(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from rich.progress import Progress

    starts: dict[str, list[dict[str, float]]] = {"exec": [], "fork": []}
    runs: dict[str, list[dict[str, float]]] = {"exec": [], "fork": []}
    imports = []
    with Progress(transient=True) as bar:
        task = bar.add_task("worker starts", total=args.repeats * 5)
        for _ in range(args.repeats):
            imports.append(one_import_s())
            bar.advance(task)
            for mode in ("exec", "fork"):  # alternating: a machine's drift hits both
                starts[mode].append(asyncio.run(hellos(mode == "fork", args.workers)))
                bar.advance(task)
                runs[mode].append(a_run(mode, args.steps, args.device))
                bar.advance(task)
    hello = {m: median_of(rows) for m, rows in starts.items()}
    run_ = {m: median_of(rows) for m, rows in runs.items()}

    def ratio(a: float, b: float) -> float:
        return round(a / b, 3) if b else float("nan")

    result = {
        "bench": "worker_start", "workers": args.workers, "repeats": args.repeats,
        "steps": args.steps, "device": args.device, "cores": os.cpu_count(),
        "one_import_s": round(statistics.median(imports), 3),
        "hello": hello, "run": run_,
        "fork_over_exec": {
            "hello_s": ratio(hello["fork"]["hello_s"], hello["exec"]["hello_s"]),
            "replacement_hello_s": ratio(hello["fork"]["replacement_hello_s"],
                                         hello["exec"]["replacement_hello_s"]),
            "exit_s": ratio(hello["fork"]["exit_s"], hello["exec"]["exit_s"]),
            "start_cpu_s": ratio(hello["fork"]["cpu_s"], hello["exec"]["cpu_s"]),
            "first_step_s": ratio(run_["fork"]["first_step_s"], run_["exec"]["first_step_s"]),
            "run_s": ratio(run_["fork"]["run_s"], run_["exec"]["run_s"]),
            "run_cpu_s": ratio(run_["fork"]["cpu_s"], run_["exec"]["cpu_s"]),
        },
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
