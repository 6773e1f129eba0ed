"""JSON over HTTP from stage functions awaited on the controller's loop: a reward server
(``openrlhf_reward``), an OpenAI-compatible judge (``api_judge``).

aiohttp, as OpenRLHF uses: the calls run on the controller's loop, where a request cost 0.14-0.19
ms of CPU against httpx's 0.67-1.35 ms (16 or 64 at once, measured on this 2-core host). One
session per event loop (a session is bound to the loop it was made on), closed when the loop
shuts down. Several URLs take the calls in turn, and a request that fails is tried again on the
next one, ``retries`` tries in all, ``RETRY_WAIT_S`` apart (OpenRLHF's 5 tries, 1 s apart);
an answer of 4xx is not tried again, but 408 and 429 (the server asks to be tried later) are.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import weakref
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

RETRY_WAIT_S = 1.0
RETRIED_4XX = frozenset({408, 429})  # timeout, too many requests: the server says try later


class Endpoints:
    """One or several URLs speaking the same JSON protocol, called in turn."""

    def __init__(self, urls: list[str], *, retries: int, timeout_s: float,
                 headers: dict[str, str] | None = None, what: str = "server") -> None:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{what}: {short(url)} is not an http(s):// URL")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 1:
            raise ValueError(f"{what}: retries must be a whole number >= 1, got {retries!r}")
        if not urls:
            raise ValueError(f"{what}: no URL given")
        self.urls, self.retries, self.timeout_s = urls, retries, timeout_s
        self.headers, self.what = dict(headers or {}), what
        self._turn = itertools.count()
        self._sessions: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop,
            tuple[aiohttp.ClientSession, AsyncIterator[aiohttp.ClientSession]]
        ] = weakref.WeakKeyDictionary()

    async def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        held = self._sessions.get(loop)
        if held is not None:
            return held[0]
        keeper = _kept_open(self.timeout_s, self.headers)
        session = await anext(keeper)
        self._sessions[loop] = (session, keeper)  # (the keeper holds it open: see below)
        return session

    async def post(self, payload: Any, path: str = "") -> Any:
        """POST ``payload`` as JSON to the next URL (``path`` appended) and return the JSON it
        answers; raises ConnectionError naming the last failure once the tries are spent, and
        ValueError for an answer that is not JSON."""
        why = ""
        session = await self._session()
        for attempt in range(self.retries):
            url = self.urls[next(self._turn) % len(self.urls)] + path
            try:
                async with session.post(url, json=payload) as answer:
                    text = await answer.text()
                    status = answer.status
            except (aiohttp.ClientError, TimeoutError) as exc:  # refused, reset: try again
                why = f"{url}: {type(exc).__name__} {short(exc, 120)}"
            else:
                if status < 400:
                    return _json(text, status, url)
                why = f"{url} answered {status}: {short(text, 120)}"
                if status < 500 and status not in RETRIED_4XX:
                    break  # the request is wrong: sending it again will not help
            if attempt + 1 < self.retries:
                await asyncio.sleep(RETRY_WAIT_S)
        raise ConnectionError(f"{self.what} failed after {attempt + 1} tries; last: {why}")


async def _kept_open(timeout_s: float,
                     headers: dict[str, str]) -> AsyncIterator[aiohttp.ClientSession]:
    """A session, closed when its loop shuts down: the loop's runner (``asyncio.run``, the
    run's ``asyncio.Runner``) closes every async generator left open before it closes, which
    runs this one's ``finally`` (a session left open is an error in the log once its loop
    is gone)."""
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s),
                                    connector=aiohttp.TCPConnector(limit=0), headers=headers)
    try:
        yield session
        await asyncio.Event().wait()  # (never resumed: closed from outside)
    finally:
        await session.close()


def _json(text: str, status: int, url: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"{url} answered {status} with no JSON: {short(text, 120)}") from None


def short(value: Any, limit: int = 60) -> str:
    """``value`` on one line (a text or an error as it reads, anything else as its repr),
    cut to ``limit`` characters: a server's answer or a file is never dumped whole."""
    text = " ".join(str(value).split()) if isinstance(value, BaseException | str) \
        else repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."

