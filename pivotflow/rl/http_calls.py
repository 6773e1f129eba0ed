"""JSON over HTTP from stage functions awaited on the controller's loop: a reward server
(``openrlhf_reward``), an OpenAI-compatible judge (``api_judge``).

aiohttp, as OpenRLHF uses: the calls run on the controller's loop, where a request cost 0.14-0.19
ms of CPU against httpx's 0.67-1.35 ms (16 or 64 at once, measured on this 2-core host). One
session per event loop (a session is bound to the loop it was made on), closed when the loop
shuts down. Several URLs take the calls in turn, and a request that fails is tried again on the
next one, ``retries`` tries in all (OpenRLHF's 5), waiting what a ``Retry-After`` header
asks, else 1 s, then 2, 4 ... (OpenRLHF waits 1 s each time; a rate-limited API wants more);
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

from pivotflow.concurrency import closed_at_shutdown

RETRY_WAIT_S = 1.0  # the first wait before a try again (OpenRLHF's fixed 1 s), then doubled
MAX_WAIT_S = 30.0  # the longest wait between tries (the stage's deadline_s bounds them all)
RETRIED_4XX = frozenset({408, 429})  # timeout, too many requests: the server says try later
_sleep = asyncio.sleep  # (the waits between tries: a test records them instead)


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
            tuple[aiohttp.ClientSession, AsyncIterator[None]]
        ] = weakref.WeakKeyDictionary()

    async def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        held = self._sessions.get(loop)
        if held is not None:
            return held[0]
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                        connector=aiohttp.TCPConnector(limit=0),
                                        headers=self.headers)
        # (closed when its loop shuts down: a session left open is an error in the log once
        # its loop is gone)
        self._sessions[loop] = (session, await closed_at_shutdown(session.close))
        return session

    async def post(self, payload: Any, path: str = "", timeout_s: float | None = None) -> Any:
        """POST ``payload`` as JSON to the next URL (``path`` appended) and return the JSON it
        answers, each try given ``timeout_s`` (default: the endpoints' own); raises CallFailed
        (a ConnectionError) naming the last failure once the tries are spent, and ValueError
        for an answer that is not JSON."""
        each_try = aiohttp.ClientTimeout(total=self.timeout_s if timeout_s is None
                                         else timeout_s)
        why, answered = "", None
        session = await self._session()
        for attempt in range(self.retries):
            url = self.urls[next(self._turn) % len(self.urls)] + path
            asked: float | None = None  # a Retry-After the server sent
            try:
                async with session.post(url, json=payload, timeout=each_try) as answer:
                    text = await answer.text()
                    status = answer.status
                    asked = _seconds(answer.headers.get("Retry-After"))
            except (aiohttp.ClientError, TimeoutError) as exc:  # refused, reset: try again
                why, answered = f"{url}: {type(exc).__name__} {short(exc, 120)}", None
            else:
                answered = status
                if status < 400:
                    return _json(text, status, url)
                why = f"{url} answered {status}: {short(text, 120)}"
                if status < 500 and status not in RETRIED_4XX:
                    break  # the request is wrong: sending it again will not help
            if attempt + 1 < self.retries:
                # what the server asks for (a rate limit's window), else doubling from
                # RETRY_WAIT_S, as OpenAI's and Anthropic's clients back off
                backoff = RETRY_WAIT_S * 2 ** attempt
                await _sleep(min(MAX_WAIT_S, backoff if asked is None else asked))
        raise CallFailed(f"{self.what} failed after {attempt + 1} tries; last: {why}", answered)


class CallFailed(ConnectionError):
    """A call that failed every try; ``status``: the last answer's HTTP status, or None when
    the last try got no answer."""

    def __init__(self, message: str, status: int | None) -> None:
        super().__init__(message)
        self.status = status


def _seconds(header: str | None) -> float | None:
    """A Retry-After header's delay in seconds (its HTTP-date form is read as none)."""
    try:
        return max(0.0, float(header)) if header is not None else None
    except ValueError:
        return None


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

