"""Controller-side cost of the zmq transport against an echo worker process over ipc.

Run: python bench/transport.py [--n 20000]

(a) one GenerateJob per frame -> one JobDone per frame; (b) 32 jobs per Jobs frame; (c) unloaded
round trip of one job, back to back and after both processes idled 1 and 5 ms (on a VM a vCPU
that halted costs a wake-up: the round trip grows with the idle time before it); (d) the naive
comparison: zmq.asyncio awaiting one recv per message.
The controller runs here (uvloop if installed) on one core, the worker on another; CPU time is
this process's (the zmq I/O thread included) divided by samples. Last line: one JSON object.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from pivotflow.protocol import (
    PROTOCOL_VERSION,
    GenerateJob,
    Hello,
    JobDone,
    Jobs,
    JobsDone,
    Shutdown,
)
from pivotflow.transport.codec import decode_to_controller, encode
from pivotflow.transport.endpoints import default_endpoint, ipc_dir_of
from pivotflow.transport.zmq_transport import ZmqControllerTransport, ZmqWorkerChannel

PROMPT = list(range(3, 67))  # 64 prompt tokens, 64 generated: a short RL sample
IN_FLIGHT = 256  # samples outstanding while measuring throughput
WARMUP = 500


def _pin(cpu: int) -> None:
    # Set before any zmq context exists: its I/O thread inherits the creating thread's mask.
    if hasattr(os, "sched_setaffinity") and cpu < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {cpu})


def worker_main(endpoint: str) -> None:
    """The echo worker: Hello, then one JobsDone (one result per job) per Jobs, until Shutdown."""
    _pin(1)
    with ZmqWorkerChannel(endpoint, "echo") as ch:
        ch.send(Hello(protocol_version=PROTOCOL_VERSION, worker_id="echo", pid=os.getpid()))
        while (msg := ch.recv(60.0)) is not None and not isinstance(msg, Shutdown):
            if isinstance(msg, Jobs):
                ch.send(JobsDone(results=[_result(j) for j in msg.jobs]))


def _result(job: GenerateJob) -> JobDone:
    n = job.max_tokens
    return JobDone(
        job_id=job.job_id,
        token_ids=job.prompt_ids[:n],
        logprobs=[-0.5] * n,
        versions=[job.min_version] * n,
        finish_reason="length",
    )


def _jobs(first: int, k: int) -> Jobs:
    return Jobs(
        jobs=[GenerateJob(job_id=first + i, prompt_ids=PROMPT, max_tokens=64) for i in range(k)]
    )


def _spawn(endpoint: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, "--worker", endpoint])


async def _throughput(
    send: Callable[[Jobs], None], on_done: list[Callable[[int], None]], n: int, per_frame: int
) -> dict[str, float]:
    """Keep IN_FLIGHT samples outstanding; each reply frame triggers the next send."""
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    state = {"sent": 0, "done": 0}

    def send_next() -> None:
        send(_jobs(state["sent"], per_frame))
        state["sent"] += per_frame

    def done(k: int) -> None:
        state["done"] += k
        if state["sent"] < n:
            send_next()
        elif state["done"] >= n and not finished.done():
            finished.set_result(None)

    on_done[0] = done
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(min(IN_FLIGHT // per_frame, n // per_frame) or 1):
        send_next()
    await finished
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {"samples_per_s": round(n / wall), "cpu_us_per_sample": round(cpu / n * 1e6, 2)}


async def bench_router(n: int, rtt_n: int, idle_s: tuple[float, ...] = ()) -> dict[str, Any]:
    """(a), (b), (c) on ZmqControllerTransport, the transport the controller ships with (with
    ``n`` 0: (c) alone, the floor ``bench/controller.py`` sets its job round trip against).
    For each of ``idle_s``, ``rtt_idle_us[str(gap)]``: the round trip after idling that long."""
    on_done: list[Callable[[int], None]] = [lambda k: None]
    hello = asyncio.get_running_loop().create_future()

    def handler(worker_id: str, msg: object) -> None:
        if isinstance(msg, JobsDone):
            on_done[0](len(msg.results))
        elif isinstance(msg, Hello) and not hello.done():
            hello.set_result(worker_id)

    with ZmqControllerTransport() as t:
        t.start(handler)
        proc = _spawn(t.endpoint)
        try:
            await asyncio.wait_for(hello, 30)

            def send(jobs: Jobs) -> None:
                t.send("echo", jobs)

            await _throughput(send, on_done, WARMUP, 1)
            out: dict[str, Any] = {}
            if n:
                out["one_per_frame"] = await _throughput(send, on_done, n, 1)
                out["batched_32"] = await _throughput(send, on_done, n, 32)
            out["rtt_us"] = await _rtt(send, on_done, rtt_n)
            if idle_s:
                out["rtt_idle_us"] = {str(gap): await _rtt(send, on_done, rtt_n // 4, gap)
                                      for gap in idle_s}
            t.send("echo", Shutdown())
            proc.wait(10)
            return out
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


async def _rtt(
    send: Callable[[Jobs], None], on_done: list[Callable[[int], None]], n: int,
    idle_s: float = 0.0,
) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    samples: list[float] = []
    for i in range(n):
        if idle_s:
            await asyncio.sleep(idle_s)  # the loop waits in epoll, as the controller does
        reply: asyncio.Future[None] = loop.create_future()
        on_done[0] = functools.partial(_resolve, reply)
        t0 = time.perf_counter()
        send(_jobs(i, 1))
        await reply
        samples.append((time.perf_counter() - t0) * 1e6)
    samples.sort()
    return {
        "p50": round(statistics.median(samples), 1),
        "p99": round(samples[int(0.99 * (n - 1))], 1),
    }


def _resolve(reply: asyncio.Future[None], _count: int) -> None:
    reply.set_result(None)


async def bench_zmq_asyncio(n: int) -> dict[str, float]:
    """(d) The naive way: a zmq.asyncio ROUTER and one awaited recv per message."""
    endpoint = default_endpoint()
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    proc = _spawn(endpoint)
    try:
        identity, _ = await asyncio.wait_for(sock.recv_multipart(), 30)  # Hello

        async def run(count: int) -> dict[str, float]:
            wall0, cpu0 = time.perf_counter(), time.process_time()
            sent = done = 0
            while sent < min(IN_FLIGHT, count):
                await sock.send_multipart([identity, encode(_jobs(sent, 1))])
                sent += 1
            while done < count:
                _, payload = await sock.recv_multipart()
                msg = decode_to_controller(payload)
                done += len(msg.results) if isinstance(msg, JobsDone) else 0
                if sent < count:
                    await sock.send_multipart([identity, encode(_jobs(sent, 1))])
                    sent += 1
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            return {
                "samples_per_s": round(count / wall),
                "cpu_us_per_sample": round(cpu / count * 1e6, 2),
            }

        await run(WARMUP)
        result = await run(n)
        await sock.send_multipart([identity, encode(Shutdown())])
        proc.wait(10)
        return result
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        sock.close(linger=0)
        ctx.term()
        shutil.rmtree(ipc_dir_of(endpoint) or "", ignore_errors=True)


async def main(n: int) -> dict[str, Any]:
    result: dict[str, Any] = {"bench": "transport"}
    result.update(await bench_router(n, rtt_n=2000, idle_s=(0.001, 0.005)))
    result["zmq_asyncio_one_per_frame"] = await bench_zmq_asyncio(n)
    one, batched, naive = (
        result["one_per_frame"],
        result["batched_32"],
        result["zmq_asyncio_one_per_frame"],
    )
    result["ratios"] = {
        "one_per_frame_vs_zmq_asyncio_throughput": round(
            one["samples_per_s"] / naive["samples_per_s"], 2
        ),
        "zmq_asyncio_vs_one_per_frame_cpu": round(
            naive["cpu_us_per_sample"] / one["cpu_us_per_sample"], 2
        ),
        "one_per_frame_vs_batched_32_cpu": round(
            one["cpu_us_per_sample"] / batched["cpu_us_per_sample"], 2
        ),
    }
    return result


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2])
        sys.exit(0)
    n = int(sys.argv[sys.argv.index("--n") + 1]) if "--n" in sys.argv else 20_000
    _pin(0)
    loop = _new_loop()
    try:
        out = loop.run_until_complete(main(n))
    finally:
        loop.close()
    out["loop"] = type(loop).__module__.split(".")[0]
    out["n"] = n
    for key in ("one_per_frame", "batched_32", "zmq_asyncio_one_per_frame"):
        print(
            f"{key:>26}: {out[key]['samples_per_s']:>8} samples/s  {out[key]['cpu_us_per_sample']:>6} us/sample"
        )
    print(f"{'rtt_us':>26}: p50 {out['rtt_us']['p50']}  p99 {out['rtt_us']['p99']}")
    for gap, rtt in out["rtt_idle_us"].items():
        print(f"{'rtt_us after ' + gap + ' s idle':>26}: p50 {rtt['p50']}  p99 {rtt['p99']}")
    print(json.dumps(out))
