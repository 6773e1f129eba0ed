"""A Prometheus text endpoint for a live run's controller (``--set metrics_port=PORT``, on
``metrics_host``, 127.0.0.1 unless told otherwise): ``GET /metrics`` answers the pools, the
queue depths and their arrival and service rates, jobs in flight, workers by state, the step,
tokens and samples so far, shifts, migrations, restarts, and the last step's numbers.

Our own tiny HTTP/1.0 handler on the controller's event loop (it reads the controller's state
between its callbacks, so no lock; no prometheus_client needed): one request per connection,
answered and closed. The port is bound by ``bind`` before anything of the run starts, so a
port in use is a one-line error that leaves nothing behind."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from typing import Any

from pivotflow.errors import ConfigError

REQUEST_TIMEOUT_S = 5.0  # a client that opens a connection and says nothing is dropped
MAX_REQUEST = 8192


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port``; ConfigError if it cannot be had (another socket
    listens there). It listens only once served (``MetricsEndpoint.start``): until then a GET
    is refused at once rather than left waiting while the models load."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise ConfigError(f"--set metrics_host={host}: not an address here ({exc})") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"--set metrics_port={port}: cannot listen on {host}:{port}: "
                          f"{exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


class MetricsEndpoint:
    """Serves ``render(ctl, last_step())`` on a bound socket until closed."""

    def __init__(self, sock: socket.socket, ctl: Any,
                 last_step: Callable[[], dict[str, Any] | None]) -> None:
        self.sock, self.ctl, self.last_step = sock, ctl, last_step
        self.server: asyncio.Server | None = None
        self.requests = 0

    async def start(self) -> None:
        try:
            self.server = await asyncio.start_server(self._serve, sock=self.sock)
        except OSError as exc:  # another process took the port to listen on since bind
            host, port = self.sock.getsockname()[:2]
            raise ConfigError(f"--set metrics_port={port}: cannot listen on {host}:{port}: "
                              f"{exc.strerror or exc}") from None

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2.0)
        self.sock.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            method, path = (head.split(b"\r\n", 1)[0].decode("latin-1").split(" ") + [""])[:2]
            if method not in ("GET", "HEAD"):
                status, body = "405 Method Not Allowed", "GET /metrics\n"
            elif path.split("?", 1)[0] not in ("/metrics", "/"):
                status, body = "404 Not Found", "GET /metrics\n"
            else:
                self.requests += 1
                status, body = "200 OK", render(self.ctl, self.last_step())
            data = body.encode()
            writer.write(f"HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4; "
                         f"charset=utf-8\r\nContent-Length: {len(data)}\r\n"
                         "Connection: close\r\n\r\n".encode())
            if method != "HEAD":
                writer.write(data)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError, UnicodeDecodeError):
            pass  # a client that went away or spoke no HTTP: nothing to answer
        finally:
            writer.close()


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_: str,
               samples: list[tuple[dict[str, str], float]]) -> None:
        self.lines += [f"# HELP pivotflow_{name} {help_}", f"# TYPE pivotflow_{name} {kind}"]
        for labels, value in samples:
            text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            self.lines.append(f"pivotflow_{name}{{{text}}} {float(value)!r}" if text
                              else f"pivotflow_{name} {float(value)!r}")


def render(ctl: Any, last: dict[str, Any] | None) -> str:
    """The controller's state now in Prometheus' text format (version 0.0.4)."""
    now = ctl.clock.now()
    t = _Text()
    t.metric("pool_workers", "gauge", "Workers in each pool now.",
             [({"pool": p.name}, len(p.workers)) for p in ctl.pools.values()])
    edges = [(e.name, e.stats(now)) for e in ctl.edges.values()]
    t.metric("queue_depth", "gauge", "Samples waiting at each stage's queue.",
             [({"edge": n}, s["depth"]) for n, s in edges])
    t.metric("queue_arrival_rate", "gauge", "Samples per second arriving at each queue.",
             [({"edge": n}, s["arrival_rate"]) for n, s in edges])
    t.metric("queue_service_rate", "gauge", "Samples per second leaving each queue for a job.",
             [({"edge": n}, s["service_rate"]) for n, s in edges])
    t.metric("jobs_in_flight", "gauge", "Jobs sent to workers and not answered, per stage.",
             [({"stage": ctl.order[i].name}, n) for i, n in ctl.inflight.items()])
    calls = ctl.calls.figures_now()
    t.metric("stage_calls_waiting", "gauge",
             "Calls of each async stage function out or waiting their turn.",
             [({"stage": name}, n) for name, n in calls.items()])
    states: dict[str, int] = {}
    for w in ctl.workers.values():
        states[w.state] = states.get(w.state, 0) + 1
    t.metric("workers", "gauge", "Workers by state.",
             [({"state": k}, v) for k, v in sorted(states.items())])
    t.metric("workers_computing", "gauge", "Workers whose last heartbeat said they were "
             "computing (loading a role, an engine step, a train step), per pool.",
             [({"pool": p.name}, sum(ctl.workers[w].computing for w in p.workers))
              for p in ctl.pools.values()])
    uptime = now - ctl.started_at if ctl.started_at else 0.0
    led = ctl.ledger
    t.metric("uptime_seconds", "gauge", "Seconds since this controller started.",
             [({}, uptime)])
    t.metric("policy_version", "gauge", "The newest policy version (optimizer steps done).",
             [({}, ctl.version)])
    t.metric("steps_target", "gauge", "The optimizer steps the run goes to.",
             [({}, ctl.cfg.steps)])
    for name, help_, value in (
            ("tokens_generated_total", "Tokens generated.", ctl.tokens_generated),
            ("prompts_admitted_total", "Prompt groups admitted.", led.prompts_in),
            ("groups_trained_total", "Groups trained.", led.groups_trained),
            ("samples_trained_total", "Samples trained.", led.samples_trained),
            ("groups_filtered_total", "Groups filtered out.", led.groups_filtered),
            ("judge_failures_total", "Verdicts that could not be parsed.", led.judge_failures),
            ("shifts_total", "Workers moved between pools.", ctl.shifts.count),
            ("migrations_total", "Generations moved with a shifting worker.",
             ctl.shifts.migrations),
            ("worker_restarts_total", "Workers restarted after dying.", ctl.recovery.restarts),
            ("generation_errors_total", "Generation jobs that failed.",
             ctl.errors["generation"])):
        t.metric(name, "counter", help_, [({}, value)])
    rate = 1.0 / uptime if uptime > 0 else 0.0
    t.metric("tokens_per_second", "gauge", "Tokens generated per second since the start.",
             [({}, ctl.tokens_generated * rate)])
    t.metric("samples_per_second", "gauge", "Samples trained per second since the start.",
             [({}, led.samples_trained * rate)])
    if last:
        from pivotflow.sinks import flat_scalars

        scalars = {k: v for k, v in flat_scalars(last).items() if "/" not in k}
        t.metric("last_step", "gauge", "The last optimizer step's metrics.jsonl numbers.",
                 [({"key": k}, v) for k, v in sorted(scalars.items())])
    return "\n".join(t.lines) + "\n"
