"""Reading one table of a workload file key by key, with errors that name file, table and key."""

from __future__ import annotations

import math
from typing import Any

from pivotflow.errors import ConfigError


class Table:
    """One table of a workload file, read key by key; reports unknown keys at the end."""

    def __init__(self, path: str, name: str, data: Any) -> None:
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: [{name}] is missing or not a table")
        self.path, self.name, self.data = path, name, data
        self.used: set[str] = set()

    def _where(self, key: str) -> str:
        return f"{self.path}: [{self.name}] {key}"

    def num(
        self,
        key: str,
        default: float | None = None,
        *,
        lo: float = 0.0,
        hi: float = math.inf,
        integer: bool = False,
        lo_open: bool = True,
    ) -> Any:
        self.used.add(key)
        if key not in self.data:
            if default is None:
                raise ConfigError(f"{self._where(key)} is required")
            return default
        v = self.data[key]
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or (integer and not isinstance(v, int))
        ):
            kind = "an integer" if integer else "a number"
            raise ConfigError(f"{self._where(key)} = {v!r} must be {kind}")
        if not math.isfinite(v) or (v <= lo if lo_open else v < lo) or v > hi:
            rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
            raise ConfigError(f"{self._where(key)} = {v!r} is outside {rng}")
        return v

    def text(self, key: str, default: str | None = None) -> str:
        self.used.add(key)
        v = self.data.get(key, default)
        if not isinstance(v, str):
            raise ConfigError(
                f"{self._where(key)} must be a string"
                + (" (required)" if key not in self.data else f", not {v!r}")
            )
        return v

    def sub(self, key: str) -> Table | None:
        self.used.add(key)
        return (
            None if key not in self.data else Table(self.path, f"{self.name}.{key}", self.data[key])
        )

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise ConfigError(
                f"{self.path}: [{self.name}] has unknown key(s) {unknown}; "
                "see bench/workloads/README.md for the schema"
            )
