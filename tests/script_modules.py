"""Helpers any test file imports (``from script_modules import load_script``: tests/ is on
the path, where a ``conftest`` name would be whichever directory's conftest was imported
first): scripts outside any package (a bench, an example, a graph file) loaded as modules, a
small JSON server on loopback (the other end of a reward adapter's HTTP), and the URL of a
server that is down."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any


def load_script(path: Path) -> ModuleType:
    """A script outside any package (a bench, an example, a graph file) as a module."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def nothing_listens(path: str) -> str:
    """``http://127.0.0.1:<port><path>`` on a loopback port nothing listens on (bound, then
    let go): a server that is down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}{path}"


class JsonHandler(BaseHTTPRequestHandler):
    """A loopback server's request handler for JSON POSTs: a subclass's ``answer(body)`` gets
    the request's JSON and returns (status, the answer's text, extra headers)."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        status, text, headers = self.answer(body)
        data = text.encode()
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def answer(self, body: Any) -> tuple[int, str, dict[str, str]]:
        raise NotImplementedError

    def log_message(self, *args: Any) -> None:
        pass  # (a line per request would drown the test's output)


@contextlib.contextmanager
def http_server(handler: type[BaseHTTPRequestHandler], path: str) -> Iterator[Any]:
    """A ThreadingHTTPServer on a free loopback port serving ``handler`` on a thread, its
    ``url`` the port plus ``path``; shut down on exit."""
    srv: Any = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}{path}"
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


@contextlib.contextmanager
def sandbox_server(cache: Path, *options: str) -> Iterator[tuple[str, str]]:
    """``python -m pivotflow.rl.sandbox_server`` on a free loopback port with 2 sandboxes and a
    cache of its own (``options`` beside): (its URL, the line it printed on starting)."""
    proc = subprocess.Popen([sys.executable, "-m", "pivotflow.rl.sandbox_server", "--port", "0",
                             "--workers", "2", *options],
                            env={**os.environ, "PIVOTFLOW_CACHE": str(cache)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "sandbox_server: listening on http://HOST:PORT ..."
        assert "listening on http://127.0.0.1:" in line, (line, proc.stderr.read()
                                                          if proc.stderr else "")
        yield line.split("listening on ")[1].split()[0], line
    finally:
        proc.terminate()
        proc.communicate(timeout=30)  # (reaped, its pipes read and closed)
