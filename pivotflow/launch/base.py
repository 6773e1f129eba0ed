"""What run.py, recovery and chaos need from a launcher (LocalLauncher and RayLauncher both)."""

from __future__ import annotations

from typing import Any, Protocol


class Launcher(Protocol):
    """Starts worker processes and tells when they end; ``stop`` reaps every one."""

    procs: dict[str, Any]  # worker id -> its process (anything with a ``pid``)

    def start(self, worker_id: str) -> None: ...

    def kill(self, worker_id: str) -> bool: ...

    def stderr_tail(self, worker_id: str, chars: int = 2000) -> str: ...

    def exited(self) -> list[tuple[str, int]]: ...

    def stop(self, timeout_s: float = 5.0) -> None: ...
