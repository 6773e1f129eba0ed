"""Where the controller binds: a private ipc path by default, loopback only without keys."""

from __future__ import annotations

import ipaddress
import os
import tempfile

from pivotflow.errors import ConfigError

__all__ = ["check_bind_address", "default_endpoint", "ipc_dir_of"]

_SOCKET_NAME = "controller.sock"

# Without CurveZMQ keys anything that can be reached from another host is refused: the protocol
# itself has no authentication, so a reachable ROUTER would take results from anyone.
_NEEDS_KEYS = "binding a non-loopback address needs CurveZMQ keys, which are not configured"


def default_endpoint() -> str:
    """A fresh ``ipc://`` endpoint in a new private temp dir (the caller removes the dir)."""
    # mkdtemp makes the dir 0700, so only this user can connect to the socket inside it.
    path = tempfile.mkdtemp(prefix="pivotflow-")
    return f"ipc://{os.path.join(path, _SOCKET_NAME)}"


def ipc_dir_of(endpoint: str) -> str | None:
    """The folder holding an ``ipc://`` endpoint's socket file, or None for other schemes."""
    if not endpoint.startswith("ipc://"):
        return None
    return os.path.dirname(endpoint[len("ipc://") :]) or None


def check_bind_address(endpoint: str, *, curve: bool = False) -> None:
    """Allow ipc://, inproc:// and loopback tcp:// (127.x.x.x, localhost, [::1]); with ``curve``
    (CurveZMQ keys configured) also tcp:// on any host or interface.

    Raises ConfigError naming the endpoint for any other scheme or host, or a malformed one.
    """
    scheme, sep, rest = endpoint.partition("://")
    if not sep or not rest:
        raise ConfigError(f"endpoint {endpoint!r} is not of the form scheme://address")
    if scheme in ("ipc", "inproc"):
        return
    if scheme != "tcp":
        # CurveZMQ secures tcp and ipc only (not pgm/epgm multicast, not udp).
        why = "only ipc, inproc and tcp can be bound" if curve else _NEEDS_KEYS
        raise ConfigError(f"endpoint {endpoint!r}: scheme {scheme!r} is not allowed; {why}")
    host, port = _split_host_port(endpoint, rest)
    if port != "*" and not (port.isdigit() and int(port) <= 65535):
        raise ConfigError(f"endpoint {endpoint!r}: port {port!r} is not a number or '*'")
    if not curve and not _is_loopback_host(host):
        raise ConfigError(f"endpoint {endpoint!r}: {host!r} is not loopback; {_NEEDS_KEYS}")


def is_loopback_tcp(endpoint: str) -> bool:
    """Whether ``endpoint`` is tcp:// on a loopback host (127.x.x.x, localhost, [::1])."""
    scheme, sep, rest = endpoint.partition("://")
    if scheme != "tcp" or not rest:
        return False
    return _is_loopback_host(_split_host_port(endpoint, rest)[0])


def _is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*", an interface name, or a host name: may be reachable


def _split_host_port(endpoint: str, rest: str) -> tuple[str, str]:
    if rest.startswith("["):
        host, sep, tail = rest[1:].partition("]")
        if not sep or not tail.startswith(":"):
            raise ConfigError(f"endpoint {endpoint!r}: expected tcp://[ipv6]:port")
        return host, tail[1:]
    host, sep, port = rest.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"endpoint {endpoint!r}: expected tcp://host:port")
    return host, port
