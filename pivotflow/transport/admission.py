"""Who may speak for a worker id: bound on its first good Hello, refused from anywhere else.

A worker's zmq identity is ``"<worker id>#<nonce>"`` (``connection_identity``): the nonce is
random per process, so two processes never share an identity, and the controller's ROUTER
runs without handover, so no second connection can take over a live identity (libzmq holds
it back instead). The first Hello for a worker id binds that id to the identity that sent
it and, with CurveZMQ, to the client's public key (zmq's ``User-Id`` of the frame); from then
on a frame claiming the id from another identity or key is refused, counted per sender and
logged. With a run secret (the controller launches each worker with
``worker_token(secret, id)`` in its environment), a Hello must also carry that token, compared
in constant time, so a stranger cannot register any id at all. A refused peer learns nothing:
its Reject says only "refused". A worker that restarts is a new process with a new id.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass, field

from pivotflow.protocol import Hello, ToController
from pivotflow.transport.codec import BadFrameLog

log = logging.getLogger(__name__)

SEPARATOR = "#"
TOKEN_ENV = "PIVOTFLOW_WORKER_TOKEN"  # where a launched worker finds its token (never argv)
REFUSED = "refused"  # the whole Reject reason a refused peer gets
MAX_TRACKED_SENDERS = 1024
OTHER_SENDERS = "<other senders>"


def new_run_secret() -> bytes:
    """A fresh per-run secret (32 random bytes); it never leaves the controller's process."""
    return secrets.token_bytes(32)


def worker_token(secret: bytes, worker_id: str) -> str:
    """The token worker ``worker_id`` of the run with ``secret`` must put in its Hello: an
    HMAC, so a worker knows its own token only and the controller keeps one secret."""
    return hmac.new(secret, worker_id.encode(), hashlib.sha256).hexdigest()


def connection_identity(worker_id: str) -> bytes:
    """The zmq identity a worker process connects with: its id and a random nonce."""
    return f"{worker_id}{SEPARATOR}{secrets.token_hex(8)}".encode()


def worker_id_of(identity: str) -> str:
    """The worker id an identity claims (all of it for a peer without a nonce)."""
    return identity.rpartition(SEPARATOR)[0] or identity


@dataclass(slots=True)
class _Binding:
    identity: bytes
    user_id: str | None


@dataclass
class Admission:
    """The controller transport's table of registered workers and of what it refused.

    ``secret`` None: any Hello registers the free id its identity claims (tests, benches), and
    frames from a peer that never said Hello are delivered as before. Counters: ``refused_hellos`` (no or wrong
    token), ``impostor_frames`` (a registered id claimed by another identity or key),
    ``unregistered_frames`` (anything but Hello before registering, with a secret); each
    also ``*_by_sender`` (bounded: past MAX_TRACKED_SENDERS senders share OTHER_SENDERS).
    """

    secret: bytes | None = None
    refused_hellos: int = 0
    impostor_frames: int = 0
    unregistered_frames: int = 0
    by_sender: dict[str, dict[str, int]] = field(default_factory=dict)
    _bound: dict[str, _Binding] = field(default_factory=dict)
    _ids: dict[bytes, str] = field(default_factory=dict)  # identity -> worker id (hot path)
    _log: BadFrameLog = field(default_factory=lambda: BadFrameLog(log))

    def fast(self, identity: bytes) -> str | None:
        """The worker id a registered identity speaks for (None: take the slow path)."""
        return self._ids.get(identity)

    def identity_of(self, worker_id: str) -> bytes:
        """Where messages to ``worker_id`` go: its registered identity (else the bare id)."""
        b = self._bound.get(worker_id)
        return b.identity if b is not None else worker_id.encode()

    def admit(
        self, identity: bytes, user_id: str | None, msg: ToController
    ) -> tuple[str | None, bool]:
        """(worker id to deliver ``msg`` as, or None to drop it; whether to answer Reject)."""
        sender = identity.decode("utf-8", "backslashreplace")
        wid = worker_id_of(sender)
        bound = self._bound.get(wid)
        if bound is not None:
            if bound.identity == identity and bound.user_id == user_id:
                return wid, False
            self.impostor_frames += 1
            self._count("impostor_frames", sender)
            self._log.warn("controller admission", identity,
                           f"claims worker {wid!r}, registered from another connection"
                           + (" and key" if bound.user_id != user_id else ""))
            return None, isinstance(msg, Hello)
        if not isinstance(msg, Hello):
            if self.secret is None:
                return wid, False  # unauthenticated mode: as before this table existed
            self.unregistered_frames += 1
            self._count("unregistered_frames", sender)
            self._log.warn("controller admission", identity,
                           f"sent {type(msg).__name__} before registering")
            return None, False
        if self.secret is not None and (msg.worker_id != wid or not hmac.compare_digest(
                msg.token.encode(), worker_token(self.secret, wid).encode())):
            self.refused_hellos += 1
            self._count("refused_hellos", sender)
            self._log.warn("controller admission", identity,
                           f"Hello for worker {msg.worker_id!r} without its run's token"
                           if msg.worker_id == wid else
                           f"Hello for worker {msg.worker_id!r} from identity {sender!r}")
            return None, True
        self._bound[wid] = _Binding(identity, user_id)
        self._ids[identity] = wid
        return wid, False

    def counters(self) -> dict[str, object]:
        """The refusals, for the run's records."""
        return {"tokens_required": self.secret is not None,
                "refused_hellos": self.refused_hellos, "impostor_frames": self.impostor_frames,
                "unregistered_frames": self.unregistered_frames,
                "by_sender": {k: dict(v) for k, v in self.by_sender.items()}}

    def _count(self, what: str, sender: str) -> None:
        table = self.by_sender.setdefault(what, {})
        if sender not in table and len(table) >= MAX_TRACKED_SENDERS:
            sender = OTHER_SENDERS
        table[sender] = table.get(sender, 0) + 1
