"""The controller socket's settings, typed: where it binds and under which CurveZMQ keys.

``RunConfig`` keeps them as the flat ``--set endpoint=`` and ``curve_keys=`` keys and composes
this (``RunConfig.transport_config``); ``launch/workers.open_workers`` opens the socket from it.
"""

from __future__ import annotations

import msgspec


class TransportConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``endpoint`` "": a private ipc path (the local launcher), or the address the Ray
    launcher picks for a cluster; ``curve_keys`` "": no encryption (loopback and ipc only)."""

    endpoint: str = ""
    curve_keys: str = ""  # a key dir (python -m pivotflow.transport.curve keygen DIR)
