"""Wire fuzz (bench/fuzz_wire.py) as a test: 100,000 hostile frames, each one accounted for."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import uvloop

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fuzz_wire.py"


@pytest.fixture(scope="module")
def fuzz_wire() -> ModuleType:
    """The bench module itself, so the test and the bench fuzz exactly the same way."""
    spec = importlib.util.spec_from_file_location("fuzz_wire", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_wire"] = module  # pickle finds CreatesFile by module name
    spec.loader.exec_module(module)
    return module


def _check(out: dict[str, Any], n: int, kinds: dict[str, Any]) -> None:
    sent = out["sent_by_kind"]
    assert sum(sent.values()) == out["frames_sent"] == n
    assert set(sent) == set(kinds), "every kind of frame was sent"
    # Every frame is accounted for: dropped and counted, or delivered; none lost, none extra.
    assert out["bad_counted"] + out["delivered"] == n
    assert out["bad_counted"] == out["expected_bad"]
    assert out["delivered"] == sent["valid"] + sent["wrong_version_hello"]
    assert out["version_mismatch"] == sent["wrong_version_hello"]
    # The sender of every bad frame is known, including the one whose id the ROUTER chose.
    by_sender = out["bad_by_sender"]
    expected = out["expected_bad_by_sender"]
    assert sum(by_sender.values()) == out["bad_counted"]
    assert {k: by_sender[k] for k in expected if k} == {k: v for k, v in expected.items() if k}
    assert sorted(by_sender.values()) == sorted(expected.values())
    # Broken ZMTP on the socket file never becomes a delivered message.
    assert out["raw_zmtp_delivered"] == 0
    assert out["served_after"] is True
    assert out["file_created"] is False
    # rate-limited: at most a burst of 10 lines per 10 s window the warnings spanned (a run
    # slowed by a busy machine spans more windows)
    windows = int(out["log_span_s"] // 10) + 1
    assert out["log_lines"] <= 10 * windows, "bad-frame warnings are rate-limited"
    assert out["log_lines"] < out["bad_counted"] / 100  # 100k bad frames, a few lines


def test_hundred_thousand_hostile_frames_on_uvloop(fuzz_wire: ModuleType) -> None:
    n = 100_000
    loop = uvloop.new_event_loop()
    try:
        out = loop.run_until_complete(fuzz_wire.fuzz(n, senders=4, seed=7))
    finally:
        loop.close()
    _check(out, n, fuzz_wire.KINDS)
    assert out["sent_by_kind"]["pickle"] > 1000


def test_fuzz_on_asyncio_debug(fuzz_wire: ModuleType) -> None:
    n = 5_000
    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    try:
        out = loop.run_until_complete(fuzz_wire.fuzz(n, senders=3, seed=11, raw_conns=20))
    finally:
        loop.close()
    _check(out, n, fuzz_wire.KINDS)
