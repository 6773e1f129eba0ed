"""``openai_judge`` against vLLM's own OpenAI-compatible server (``vllm.entrypoints.openai.
api_server``, a process of its own, CPU build) on the session's tiny Qwen2 folder: its verdicts
are ``examples/openai_server.py``'s (the embedded engine behind the same endpoints), and what
vLLM refuses is a one-line error. Skipped without vllm (the main environment)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm_fixtures import MAX_LEN  # noqa: E402

from pivotflow.rl.api_judge import openai_judge  # noqa: E402

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parents[2]
# letters only: transformers 5 (which vLLM tokenizes with) reads this folder's tokenizer as
# Qwen2Tokenizer, whose pre-tokenizer splits digits apart where tokenizer.json's does not
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dogs"]


@pytest.fixture(scope="module")
def vllm_server(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "OMP_NUM_THREADS": "1"}
    log = (tmp_path_factory.mktemp("vllm-serve") / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
         "--served-model-name", "judge", "--host", "127.0.0.1", "--port", str(port),
         "--dtype", "float32", "--max-model-len", str(MAX_LEN), "--enforce-eager",
         "--gpu-memory-utilization", "0.1"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300  # (27 s on a quiet 2-core host)
        while True:
            assert proc.poll() is None, f"vLLM's server exited {proc.returncode}: {log.name}"
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline, f"vLLM's server did not start: {log.name}"
                time.sleep(1)
        yield url
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()


@pytest.fixture(scope="module")
def ours(folder: Path) -> Iterator[str]:
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import openai_server
    finally:
        sys.path.pop(0)
    srv = openai_server.serve_in_thread(folder, name="judge")
    yield srv.url()
    srv.shutdown()
    srv.server_close()


def template(prompt: str, response: str, **_: Any) -> str:
    return f"{prompt} {response}"


def length(verdict: str, **_: Any) -> float:
    return float(len(verdict))


def test_vllms_server_judges_as_the_embedded_engine_behind_the_same_api(
        vllm_server: str, ours: str) -> None:
    by_vllm = openai_judge(vllm_server, "judge", template, length, max_tokens=8)
    by_ours = openai_judge(ours, "judge", template, length, max_tokens=8)

    async def both() -> list[tuple[str, str]]:
        out = []
        for i in range(8):
            fields = {"prompt": " ".join(WORDS[i:] + WORDS[:i]), "response": WORDS[3 * i % 8]}
            a, b = await by_vllm(**fields), await by_ours(**fields)
            out.append((a["verdict"], b["verdict"]))
        return out

    pairs = asyncio.run(both())
    # a random model's text ends mid-character at times: vLLM's detokenizer holds those bytes
    # back, ours shows U+FFFD for them; every whole character is the same
    assert [a.rstrip("\ufffd") for a, _ in pairs] == [b.rstrip("\ufffd") for _, b in pairs]
    assert all(a for a, _ in pairs)


def test_what_vllm_refuses_is_a_one_line_error(vllm_server: str) -> None:
    chat = openai_judge(vllm_server, "judge", lambda **_: [{"role": "user", "content": "hi"}],
                        length, retries=1)  # (the folder has no chat template)
    with pytest.raises(ConnectionError, match=r"^judge 'judge' failed after 1 tries; last: "
                                              r"http://127.0.0.1:\d+/v1/chat/completions "
                                              r"answered 400: ") as info:
        asyncio.run(chat(prompt="p", response="r"))
    assert "\n" not in str(info.value) and len(str(info.value)) < 400
    wrong = openai_judge(vllm_server, "no-such-model", template, length, retries=1)
    with pytest.raises(ConnectionError, match=r"answered 404: "):
        asyncio.run(wrong(prompt="p", response="r"))
