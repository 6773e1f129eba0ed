"""Tools that misbehave on purpose, imported by the tool pool's worker processes in tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time

from pivotflow.tools import tool


@tool
def echo(text: str, times: int = 1) -> str:
    """Repeat text.

    Args:
        text: what to repeat.
        times: how often.
    """
    return text * times


@tool
def boom(message: str) -> str:
    """Raise a RuntimeError."""
    raise RuntimeError(message)


@tool
def sleeper(seconds: float) -> str:
    """Sleep (a hung tool)."""
    time.sleep(seconds)
    return "woke"


@tool
def span(seconds: float) -> str:
    """Sleep, and say when it started and ended (wall clock, comparable across processes)."""
    start = time.time()
    time.sleep(seconds)
    return f"{start} {time.time()}"


@tool
def spin() -> str:
    """Loop forever on the CPU."""
    n = 0
    while True:
        n += 1


@tool
def fork_bomb(forks: int) -> int:
    """Try to fork ``forks`` times, ignoring failures (each child would fork too)."""
    made = 0
    for _ in range(forks):
        try:
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
            made += 1
        except OSError:
            pass
    return made


@tool
def hog() -> str:
    """Allocate 1 MB at a time without bound."""
    chunks = []
    while True:
        chunks.append(bytearray(1 << 20))


@tool
def connect() -> str:
    """Open a TCP socket to a public address."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(0.5)
    s.connect(("1.1.1.1", 53))
    return "connected"


@tool
def interfaces() -> list[str]:
    """The network interfaces of this process's network namespace."""
    with open("/proc/self/net/dev") as f:
        return sorted(line.split(":")[0].strip() for line in f.readlines()[2:])


@tool
def crash(how: str) -> str:
    """Die: "exit" (status 7) or "segv" (SIGSEGV)."""
    if how == "exit":
        os._exit(7)
    os.kill(os.getpid(), signal.SIGSEGV)
    return "alive"


@tool
def flood() -> str:
    """Write a megabyte with no newline to every pipe this process can write to."""
    for fd in range(3, 64):
        with contextlib.suppress(OSError):
            os.write(fd, b"x" * (1 << 20))
    return "flooded"


@tool
def printer(text: str) -> None:
    """Print text and return nothing (the pool returns what was printed)."""
    print(text)


class Counter:
    """Count calls in this worker process."""

    name = "counter"

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, step: int = 1) -> int:
        self.n += step
        return self.n
