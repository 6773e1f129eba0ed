"""CurveZMQ keys for the wire: make them, load them, and admit only known workers.

A key directory holds (z85 keys in czmq's certificate format, as ``zmq.auth`` reads them)::

    DIR/controller.key          the controller's public key (every worker needs it)
    DIR/controller.key_secret   the controller's keypair (the controller only; mode 0600)
    DIR/<name>.key_secret       a worker keypair (the workers only; mode 0600)
    DIR/<name>.key              its public half
    DIR/allowed_clients/*.key   public keys the controller admits; nothing else gets in

Make one with ``python -m pivotflow.transport.curve keygen DIR [--client NAME ...]`` and add a
worker key later with ``... add-client DIR NAME``. The controller loads ``load_controller_keys``,
a worker ``load_worker_keys``; both are passed as ``curve=`` to the zmq transport.
"""

from __future__ import annotations

import argparse
import logging
import os
import stat
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from pivotflow.errors import CurveKeyError

__all__ = [
    "CurveAuthenticator",
    "CurveKeys",
    "add_client",
    "configure_client",
    "configure_server",
    "keygen",
    "load_controller_keys",
    "load_worker_keys",
    "read_allowed",
]

log = logging.getLogger(__name__)

CONTROLLER = "controller"
ALLOWED_DIR = "allowed_clients"
DEFAULT_CLIENT = "worker"
# Set on the ROUTER so libzmq always asks our ZAP handler, and the handler only answers for it.
ZAP_DOMAIN = "pivotflow"
_Z85_KEY_CHARS = 40  # a 32-byte curve25519 key in z85

# Refused handshakes logged per window; a scanner retrying every 100 ms must not fill the log.
_REFUSAL_LOG_BURST = 10
_REFUSAL_LOG_WINDOW_S = 60.0


@dataclass(frozen=True, slots=True)
class CurveKeys:
    """One side's CurveZMQ key material (z85-encoded).

    ``server_key`` is the controller's public key (equal to ``public_key`` on the controller).
    ``allowed_clients`` and ``allowed_clients_dir`` are set on the controller's keys only.
    """

    public_key: bytes
    secret_key: bytes = field(repr=False)
    server_key: bytes
    allowed_clients: frozenset[bytes] = frozenset()
    allowed_clients_dir: Path | None = None

    @property
    def is_controller(self) -> bool:
        """True for keys loaded with ``load_controller_keys`` (they carry an allow list)."""
        return self.allowed_clients_dir is not None


def keygen(key_dir: str | os.PathLike[str], clients: Iterable[str] = (DEFAULT_CLIENT,)) -> Path:
    """Create a key directory: a controller keypair and one allowed keypair per client name.

    Returns the directory. Raises CurveKeyError if a key file to be written already exists
    (keys are never silently rotated) or a name is not a plain file name.
    """
    _require_curve()
    root = Path(key_dir)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    (root / ALLOWED_DIR).mkdir(mode=0o700, exist_ok=True)
    _write_keypair(root, CONTROLLER)
    for name in clients:
        add_client(root, name)
    return root


def add_client(key_dir: str | os.PathLike[str], name: str) -> CurveKeys:
    """Make a worker keypair ``name`` in ``key_dir`` and allow it; returns its loaded keys.

    A running controller admits it after ``CurveAuthenticator.reload()``. Raises CurveKeyError
    if ``name`` exists already, is not a plain file name, or the directory is not a key dir.
    """
    _require_curve()
    root = Path(key_dir)
    if not (root / ALLOWED_DIR).is_dir():
        raise CurveKeyError(f"{root} is not a key directory (no {ALLOWED_DIR}/); run keygen first")
    public, _ = _write_keypair(root, name)
    _write_key_file(root / ALLOWED_DIR / f"{name}.key", public, None)
    return load_worker_keys(root, name)


def load_controller_keys(key_dir: str | os.PathLike[str]) -> CurveKeys:
    """The controller's keypair and the public keys of the clients it admits.

    Raises CurveKeyError naming the file if a key is missing or malformed, the secret key is
    readable by others, or the allow list is missing, empty, or writable by others.
    """
    _require_curve()
    root = Path(key_dir)
    public, secret = _read_keypair(root / f"{CONTROLLER}.key_secret")
    allowed_dir = root / ALLOWED_DIR
    return CurveKeys(
        public_key=public,
        secret_key=secret,
        server_key=public,
        allowed_clients=read_allowed(allowed_dir),
        allowed_clients_dir=allowed_dir,
    )


def load_worker_keys(key_dir: str | os.PathLike[str], name: str = DEFAULT_CLIENT) -> CurveKeys:
    """Worker ``name``'s keypair and the controller's public key.

    Raises CurveKeyError naming the file if one is missing, malformed or (a secret) readable
    by others.
    """
    _require_curve()
    root = Path(key_dir)
    public, secret = _read_keypair(root / f"{_plain_name(name)}.key_secret")
    return CurveKeys(
        public_key=public, secret_key=secret, server_key=_read_public(root / f"{CONTROLLER}.key")
    )


def read_allowed(allowed_dir: Path) -> frozenset[bytes]:
    """The public keys in ``allowed_dir/*.key``; raises CurveKeyError if unusable or empty."""
    if not allowed_dir.is_dir():
        raise CurveKeyError(f"allowed-clients directory {allowed_dir} does not exist")
    if allowed_dir.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        # Whoever can write here can admit themselves.
        raise CurveKeyError(f"{allowed_dir} is writable by other users; chmod go-w it")
    keys = frozenset(_read_public(p) for p in sorted(allowed_dir.glob("*.key")))
    if not keys:
        raise CurveKeyError(f"{allowed_dir} holds no *.key files: no worker could connect")
    return keys


def configure_server(sock: zmq.Socket[bytes], keys: CurveKeys) -> None:
    """Make ``sock`` a CurveZMQ server (before it binds); raises CurveKeyError for client keys."""
    if not keys.is_controller:
        raise CurveKeyError(
            "the controller needs keys from load_controller_keys (with an allow list)"
        )
    sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret_key)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public_key)
    sock.setsockopt(zmq.CURVE_SERVER, 1)


def configure_client(sock: zmq.Socket[bytes], keys: CurveKeys) -> None:
    """Make ``sock`` a CurveZMQ client of the controller ``keys.server_key`` (before connecting)."""
    sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server_key)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public_key)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret_key)


class CurveAuthenticator:
    """A ZAP handler thread on ``ctx`` that admits only clients in ``keys.allowed_clients``.

    Start it before the server socket binds (libzmq admits everyone when no handler listens).
    ``admitted`` and ``refused`` count handshakes; refusals are logged, rate-limited.
    """

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], keys: CurveKeys) -> None:
        if keys.allowed_clients_dir is None:
            raise CurveKeyError("the controller needs keys from load_controller_keys")
        self.admitted = 0
        self.refused = 0
        self._dir = keys.allowed_clients_dir
        self._allowed = keys.allowed_clients
        self._window_start = -float("inf")
        self._logged = 0
        self._auth = ThreadAuthenticator(ctx, log=logging.getLogger(__name__ + ".zap"))
        self._auth.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=self)
        self._auth.start()

    def callback(self, domain: str, key: bytes) -> bool:
        """ZAP verdict for the z85 client ``key`` (called on the authenticator's thread)."""
        if key in self._allowed:
            self.admitted += 1
            return True
        self.refused += 1
        now = time.monotonic()
        if now - self._window_start >= _REFUSAL_LOG_WINDOW_S:
            self._window_start, self._logged = now, 0
        if self._logged < _REFUSAL_LOG_BURST:
            self._logged += 1
            log.warning(
                "refused a CurveZMQ client with unknown public key %r (%d refused so far)",
                key.decode("ascii", "replace"),
                self.refused,
            )
        return False

    def reload(self) -> None:
        """Re-read the allow list (after ``add_client``); raises CurveKeyError if unusable."""
        self._allowed = read_allowed(self._dir)

    def stop(self) -> None:
        """Stop the ZAP thread (before the context is terminated). Idempotent."""
        self._auth.stop()


def _require_curve() -> None:
    if not zmq.has("curve"):
        raise CurveKeyError(f"this libzmq ({zmq.zmq_version()}) was built without CURVE support")


def _plain_name(name: str) -> str:
    if not name or name != os.path.basename(name) or name.startswith("."):
        raise CurveKeyError(f"key name {name!r} must be a plain file name")
    return name


def _write_keypair(root: Path, name: str) -> tuple[bytes, bytes]:
    public, secret = zmq.curve_keypair()
    _write_key_file(root / f"{_plain_name(name)}.key_secret", public, secret)
    _write_key_file(root / f"{name}.key", public, None)
    return public, secret


def _write_key_file(path: Path, public: bytes, secret: bytes | None) -> None:
    """Write a czmq-format certificate; a secret one is created 0600, and nothing is overwritten."""
    lines = ["#   ****  pivotflow CurveZMQ " + ("SECRET" if secret else "public") + " key  ****"]
    lines += ["metadata", "curve", f'    public-key = "{public.decode()}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if secret else 0o644)
    except FileExistsError:
        raise CurveKeyError(f"key file {path} already exists; keys are never overwritten") from None
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")


def _read_keypair(path: Path) -> tuple[bytes, bytes]:
    if path.exists() and path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CurveKeyError(f"secret key file {path} is accessible by other users; chmod 600 it")
    public, secret = _load(path)
    if secret is None:
        raise CurveKeyError(f"key file {path} holds no secret-key")
    return public, _check_key(path, secret)


def _read_public(path: Path) -> bytes:
    return _load(path)[0]


def _load(path: Path) -> tuple[bytes, bytes | None]:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise CurveKeyError(f"cannot read CurveZMQ key file {path}: {exc}") from None
    return _check_key(path, public), secret


def _check_key(path: Path, key: bytes) -> bytes:
    try:
        ok = len(key) == _Z85_KEY_CHARS and len(z85.decode(key)) == 32
    except (ValueError, KeyError, IndexError):
        ok = False
    if not ok:
        raise CurveKeyError(f"key file {path} holds a malformed key (expected 40 z85 characters)")
    return key


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pivotflow.transport.curve keygen DIR [--client NAME ...] | add-client DIR NAME``."""
    parser = argparse.ArgumentParser(prog="python -m pivotflow.transport.curve")
    sub = parser.add_subparsers(dest="cmd", required=True)
    gen = sub.add_parser("keygen", help="create a key directory")
    gen.add_argument("dir")
    gen.add_argument(
        "--client", action="append", help=f"client key name (default {DEFAULT_CLIENT})"
    )
    add = sub.add_parser("add-client", help="add an allowed worker keypair to a key directory")
    add.add_argument("dir")
    add.add_argument("name")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "keygen":
            keygen(args.dir, args.client or (DEFAULT_CLIENT,))
        else:
            add_client(args.dir, args.name)
    except CurveKeyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"keys in {args.dir}: give workers {CONTROLLER}.key and their <name>.key_secret")
    return 0


if __name__ == "__main__":
    sys.exit(main())
