"""The cluster address a run is given (``--set ray.address=HOST:PORT``), checked first."""

from __future__ import annotations

import socket

from pivotflow.errors import ConfigError


def check_reachable(address: str) -> None:
    """A HOST:PORT that nothing answers on fails here in seconds (ray.init retries for
    minutes)."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"--set ray.address={address}: expected auto or HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=5.0).close()
    except OSError as exc:
        raise ConfigError(f"--set ray.address={address}: cannot reach a Ray cluster there "
                          f"({exc.strerror or exc})") from None
