"""A small OpenAI-compatible server on pivotflow's embedded engine: a model folder behind
``/v1/completions`` and ``/v1/chat/completions``, as ``vllm serve`` or SGLang put one.

    python examples/openai_server.py MODEL_DIR [--port 8000] [--name judge] [--max-batch 32]

It is here so that a judge behind an API (``pivotflow.rl.api_judge.openai_judge``) runs on this
CPU without vLLM: ``examples/api_judge.py`` starts it on the built-in judge and trains against
it. For a real deployment serve the judge with vLLM or SGLang (the same two endpoints).

What it serves (the fields a judge sends; others are ignored):

* ``POST /v1/completions``: ``{"model", "prompt" (a string), "max_tokens", "temperature",
  "top_p", "seed"}``: the prompt encoded with the tokenizer's special tokens (a BOS where the
  model has one), as vLLM does;
* ``POST /v1/chat/completions``: ``{"model", "messages", ...}``: the messages rendered with the
  model's chat template and a generation prompt;
* ``GET /v1/models``.

Answers carry ``choices[0].text`` (or ``.message.content``) with special tokens left out,
``finish_reason`` ("stop" or "length") and ``usage``. One engine thread batches whatever
requests are waiting (continuous batching, up to ``--max-batch``); each HTTP request waits on
its own thread. A bad request is a 400 with OpenAI's ``{"error": {"message", "type"}}``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import queue
import threading
import time
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pivotflow.engines.base import GenerationOutput, GenerationRequest, SamplingParams
from pivotflow.engines.torch.engine import TorchEngine
from pivotflow.engines.torch.weights import load_model_folder
from pivotflow.tokenizer import load_tokenizer


class EngineThread:
    """The engine, stepped on a thread of its own; ``generate`` is called from any thread."""

    def __init__(self, folder: Path, max_batch: int) -> None:
        model = load_model_folder(folder)
        self.tok = load_tokenizer(folder)
        self.engine = TorchEngine(model.config, max_batch=max_batch,
                                  eos_token_ids=(*model.eos_ids, *self.tok.eos_ids),
                                  vocab_limit=min(self.tok.vocab_size, model.config.vocab_size))
        self.engine.load_weights(model.tensors, 0)
        self.context = self.engine.max_seq_len
        self._new: queue.SimpleQueue[tuple[GenerationRequest, Future[GenerationOutput]]] = \
            queue.SimpleQueue()
        self._waiting: dict[str, Future[GenerationOutput]] = {}
        self._ids = itertools.count()
        threading.Thread(target=self._serve, name="engine", daemon=True).start()

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput:
        done: Future[GenerationOutput] = Future()
        self._new.put((GenerationRequest(f"r{next(self._ids)}", prompt_ids, params), done))
        return done.result()

    def _serve(self) -> None:
        while True:
            # block while idle; take everything waiting before each step (it batches them)
            if not self.engine.has_work():
                self._add(*self._new.get())
            with contextlib.suppress(queue.Empty):
                while True:
                    self._add(*self._new.get_nowait())
            for out in self.engine.step():
                self._waiting.pop(out.request_id).set_result(out)

    def _add(self, request: GenerationRequest, done: Future[GenerationOutput]) -> None:
        try:
            self.engine.add_request(request)
        except Exception as exc:  # a prompt too long for the context, say: that request's
            done.set_exception(exc)
            return
        self._waiting[request.request_id] = done


class OpenAIServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # a judge stage sends many requests at once (see reward_server)

    def __init__(self, engine: EngineThread, name: str, port: int) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.engine, self.name = engine, name
        self.requests = 0

    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _BadRequest(Exception):
    pass


class _Handler(BaseHTTPRequestHandler):
    server: OpenAIServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.rstrip("/") == "/v1/models":
            self._answer(200, {"object": "list", "data": [
                {"id": self.server.name, "object": "model", "owned_by": "pivotflow"}]})
        else:
            self._answer(404, _error(f"no route GET {self.path}", "not_found_error"))

    def do_POST(self) -> None:  # noqa: N802
        chat = self.path.rstrip("/") == "/v1/chat/completions"
        if not chat and self.path.rstrip("/") != "/v1/completions":
            self._answer(404, _error(f"no route POST {self.path}", "not_found_error"))
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            answer = self._complete(body, chat)
        except (_BadRequest, ValueError, KeyError, TypeError) as exc:
            self._answer(400, _error(f"{type(exc).__name__}: {exc}", "invalid_request_error"))
            return
        self._answer(200, answer)

    def _complete(self, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        srv = self.server
        srv.requests += 1
        tok = srv.engine.tok
        if chat:
            messages = body["messages"]
            prompt_ids = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))
        else:
            if not isinstance(body.get("prompt"), str):
                raise _BadRequest("'prompt' must be a string")
            prompt_ids = tok.encode(body["prompt"], add_special_tokens=True)
        max_tokens = int(body.get("max_tokens") or 16)
        if len(prompt_ids) + max_tokens > srv.engine.context:
            raise _BadRequest(f"{len(prompt_ids)} prompt tokens + max_tokens {max_tokens} is "
                              f"over the model's context of {srv.engine.context}")
        seed = body.get("seed")
        params = SamplingParams(temperature=float(body.get("temperature", 1.0)),
                                top_p=float(body.get("top_p", 1.0)), max_tokens=max_tokens,
                                seed=None if seed is None else int(seed))
        out = srv.engine.generate(prompt_ids, params)
        ids = [t for t in out.token_ids if t not in tok.eos_ids]
        text = tok.decode(ids)
        reason = "length" if out.finish_reason == "length" else "stop"
        choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text},
                                   "finish_reason": reason} if chat
                                  else {"index": 0, "text": text, "finish_reason": reason})
        return {"id": f"cmpl-{srv.requests}", "created": int(time.time()), "model": srv.name,
                "object": "chat.completion" if chat else "text_completion",
                "choices": [choice],
                "usage": {"prompt_tokens": len(prompt_ids),
                          "completion_tokens": len(out.token_ids),
                          "total_tokens": len(prompt_ids) + len(out.token_ids)}}

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # one line per request would drown the run's own output


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind}}


def serve_in_thread(folder: Path, name: str = "judge", port: int = 0,
                    max_batch: int = 32) -> OpenAIServer:
    """The server on 127.0.0.1 (``port`` 0: any free one), serving on a daemon thread."""
    server = OpenAIServer(EngineThread(folder, max_batch), name, port)
    threading.Thread(target=server.serve_forever, args=(0.05,), name="openai-server",
                     daemon=True).start()
    return server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path, help="a model folder (config.json, safetensors, "
                                             "tokenizer.json)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--name", default=None, help="the model name it answers to (default: "
                                                 "the folder's name)")
    ap.add_argument("--max-batch", type=int, default=32)
    args = ap.parse_args()
    server = OpenAIServer(EngineThread(args.model, args.max_batch),
                          args.name or args.model.name, args.port)
    print(f"serving {args.model} as {server.name!r} at {server.url()}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C stops it
        server.serve_forever()


if __name__ == "__main__":
    main()
