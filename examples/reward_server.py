"""A rule-based reward server speaking OpenRLHF's remote reward protocol (what
``openrlhf.cli.serve_rm`` and OpenRLHF's ``--remote_rm_url`` speak), for the built-in sums.

    python examples/reward_server.py --port 5000 [--latency-ms 20]

``POST /get_reward`` with ``{"query": [...], "prompts": [...], "labels": [...]}`` answers
``{"rewards": [...], "scores": [...], "extra_logs": {"response_chars": [...]}}``: each query is a
prompt and its response decoded with special tokens (the prompt as its chat template rendered
it); the response is the text after the prompt, up to its first stop token, and its reward is
1.0 when it is the label (the right sum), else 0.0. ``--latency-ms`` holds each request that
long, as a model-based server's forward pass would (``bench/remote_reward.py`` measures a run
against it). Requests are served on threads of their own, so several are answered at once.

It is a server a user would run beside training, not part of pivotflow: see
``examples/openrlhf_remote_rm.py`` for the run that calls it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pivotflow.tasks.arithmetic import check_answer

# stop tokens' texts of the built-in models and the common chat models
STOPS = ("<eos>", "<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>", "<|end_of_text|>")


def reward(query: str, prompt: str, label: Any) -> tuple[float, int]:
    """(reward, response length in characters) of one query."""
    response = query[len(prompt):] if query.startswith(prompt) else query
    for stop in STOPS:
        response = response.split(stop, 1)[0]
    right = label is not None and check_answer(str(label), response)
    return float(right), len(response)


class RewardServer(ThreadingHTTPServer):
    """Counts requests and the most answered at once (what a test or bench reads)."""

    daemon_threads = True
    # a client sends a run's worth of requests at once: http.server's backlog of 5 dropped
    # connections past it, each then waiting out TCP's 1 s retransmission (measured: 64 at
    # once took 4.1 s)
    request_queue_size = 256

    def __init__(self, port: int, latency_s: float = 0.0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.latency_s = latency_s
        self.requests = 0
        self.queries = 0
        self.most_at_once = 0
        self._now = 0
        self._lock = threading.Lock()
        self.seen: list[dict[str, Any]] = []  # the last 100 payloads

    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/get_reward"

    def enter(self, payload: dict[str, Any]) -> None:
        with self._lock:
            self.requests += 1
            self.queries += len(payload.get("query") or [])
            self._now += 1
            self.most_at_once = max(self.most_at_once, self._now)
            self.seen = [*self.seen[-99:], payload]

    def leave(self) -> None:
        with self._lock:
            self._now -= 1


class _Handler(BaseHTTPRequestHandler):
    server: RewardServer
    protocol_version = "HTTP/1.1"  # keep-alive: a client's connections are reused
    # the headers and the body are two writes: with Nagle's algorithm the second waits for
    # the client's delayed ACK (40 ms a request, measured)
    disable_nagle_algorithm = True

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        try:
            payload = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            queries, prompts = payload["query"], payload["prompts"]
            labels = payload.get("labels") or [None] * len(queries)
        except (ValueError, KeyError, TypeError) as exc:
            self._answer(400, {"error": f"bad request: {exc}"})
            return
        self.server.enter(payload)
        try:
            time.sleep(self.server.latency_s)
            scored = [reward(q, p, label) for q, p, label in zip(queries, prompts, labels,
                                                                 strict=True)]
        finally:
            self.server.leave()
        rewards = [r for r, _ in scored]
        self._answer(200, {"rewards": rewards, "scores": rewards,
                           "extra_logs": {"response_chars": [n for _, n in scored]}})

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # one line per request would drown the run's own output


def serve_in_thread(port: int = 0, latency_s: float = 0.0) -> RewardServer:
    """A server on 127.0.0.1 (``port`` 0: any free one), serving on a daemon thread; stop it
    with ``shutdown()``."""
    server = RewardServer(port, latency_s)
    threading.Thread(target=server.serve_forever, args=(0.05,), name="reward-server",
                     daemon=True).start()
    return server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=5000)
    ap.add_argument("--latency-ms", type=float, default=0.0)
    args = ap.parse_args()
    server = RewardServer(args.port, args.latency_ms / 1000)
    print(f"serving OpenRLHF's reward protocol at {server.url()}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C stops it
        server.serve_forever()


if __name__ == "__main__":
    main()
