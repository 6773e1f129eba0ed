"""CurveZMQ on the wire: key files, the bind rule, and a controller that admits only known keys."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from pathlib import Path

import pytest
import zmq

from pivotflow.errors import ConfigError, CurveKeyError
from pivotflow.protocol import PROTOCOL_VERSION, Heartbeat, Hello, ToController, Welcome
from pivotflow.transport.codec import encode
from pivotflow.transport.curve import (
    ALLOWED_DIR,
    add_client,
    keygen,
    load_controller_keys,
    load_worker_keys,
    main,
)
from pivotflow.transport.endpoints import check_bind_address
from pivotflow.transport.zmq_transport import ZmqControllerTransport, ZmqWorkerChannel

WAIT_S = 10.0


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_keygen_layout_permissions_and_loading(tmp_path: Path) -> None:
    root = keygen(tmp_path / "keys", clients=["w0", "w1"])
    assert _mode(root) == 0o700 and _mode(root / ALLOWED_DIR) == 0o700
    for name in ("controller", "w0", "w1"):
        assert _mode(root / f"{name}.key_secret") == 0o600
    assert sorted(p.name for p in (root / ALLOWED_DIR).iterdir()) == ["w0.key", "w1.key"]
    ctl = load_controller_keys(root)
    w0, w1 = load_worker_keys(root, "w0"), load_worker_keys(root, "w1")
    assert ctl.is_controller and not w0.is_controller
    assert ctl.server_key == ctl.public_key == w0.server_key == w1.server_key
    assert ctl.allowed_clients == {w0.public_key, w1.public_key}
    assert len({ctl.secret_key, w0.secret_key, w1.secret_key}) == 3
    assert all(len(k) == 40 for k in (ctl.public_key, ctl.secret_key, w0.secret_key))
    assert "secret" not in repr(w0).replace("secret_key", "")  # the secret is not printed
    assert w0.secret_key.decode() not in repr(w0)


def test_keys_are_never_overwritten_and_names_are_plain(tmp_path: Path) -> None:
    root = keygen(tmp_path, clients=["w0"])
    before = (root / "controller.key_secret").read_bytes()
    with pytest.raises(CurveKeyError, match="already exists"):
        keygen(root, clients=["w9"])
    with pytest.raises(CurveKeyError, match="already exists"):
        add_client(root, "w0")
    with pytest.raises(CurveKeyError, match="plain file name"):
        add_client(root, "../evil")
    with pytest.raises(CurveKeyError, match="not a key directory"):
        add_client(tmp_path / "nowhere", "w1")
    assert (root / "controller.key_secret").read_bytes() == before


def test_unsafe_or_broken_key_files_are_refused(tmp_path: Path) -> None:
    root = keygen(tmp_path, clients=["w0"])
    os.chmod(root / "w0.key_secret", 0o640)
    with pytest.raises(CurveKeyError, match=r"w0\.key_secret.*chmod 600"):
        load_worker_keys(root, "w0")
    os.chmod(root / "w0.key_secret", 0o600)
    os.chmod(root / ALLOWED_DIR, 0o777)
    with pytest.raises(CurveKeyError, match="writable by other users"):
        load_controller_keys(root)
    os.chmod(root / ALLOWED_DIR, 0o700)
    (root / ALLOWED_DIR / "w0.key").write_text('curve\n    public-key = "too-short"\n')
    with pytest.raises(CurveKeyError, match=r"w0\.key holds a malformed key"):
        load_controller_keys(root)
    (root / ALLOWED_DIR / "w0.key").unlink()
    with pytest.raises(CurveKeyError, match="holds no \\*.key files"):
        load_controller_keys(root)
    with pytest.raises(CurveKeyError, match=r"nobody\.key_secret"):
        load_worker_keys(root, "nobody")
    with pytest.raises(CurveKeyError, match="allow list"):
        ZmqControllerTransport("tcp://127.0.0.1:*", curve=load_worker_keys(root, "w0"))


def test_cli_keygen_and_add_client(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keygen", str(tmp_path / "k"), "--client", "a"]) == 0
    assert main(["add-client", str(tmp_path / "k"), "b"]) == 0
    assert main(["add-client", str(tmp_path / "k"), "b"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert len(load_controller_keys(tmp_path / "k").allowed_clients) == 2


@pytest.mark.parametrize(
    "address", ["tcp://0.0.0.0:5555", "tcp://10.1.2.3:*", "tcp://*:5555", "tcp://[::]:1"]
)
def test_reachable_addresses_need_keys(address: str) -> None:
    with pytest.raises(ConfigError, match="CurveZMQ keys"):
        check_bind_address(address)
    check_bind_address(address, curve=True)


@pytest.mark.parametrize("address", ["pgm://10.0.0.1;239.0.0.1:5555", "tcp://0.0.0.0", "x"])
def test_keys_do_not_allow_other_schemes_or_malformed(address: str) -> None:
    with pytest.raises(ConfigError):
        check_bind_address(address, curve=True)


def test_with_keys_the_controller_binds_all_interfaces(tmp_path: Path) -> None:
    keys = load_controller_keys(keygen(tmp_path))
    with ZmqControllerTransport("tcp://0.0.0.0:*", curve=keys) as t:
        assert t.endpoint.startswith("tcp://0.0.0.0:")
        assert t.authenticator is not None


def test_only_allowed_keys_get_a_message_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = keygen(tmp_path / "keys", clients=["good"])
    stranger = load_worker_keys(keygen(tmp_path / "other", clients=["bad"]), "bad")
    # A key the controller does not know, presented to the right server key: ZAP refuses it.
    unknown = type(stranger)(
        public_key=stranger.public_key,
        secret_key=stranger.secret_key,
        server_key=load_worker_keys(root, "good").server_key,
    )

    async def main() -> None:
        inbox: list[tuple[str, ToController]] = []
        got = asyncio.Event()

        def handler(worker_id: str, msg: ToController) -> None:
            inbox.append((worker_id, msg))
            got.set()

        with ZmqControllerTransport("tcp://127.0.0.1:*", curve=load_controller_keys(root)) as t:
            t.start(handler)
            ctx = zmq.Context()
            plain = ctx.socket(zmq.DEALER)  # no curve at all
            plain.setsockopt(zmq.LINGER, 0)
            plain.setsockopt(zmq.IDENTITY, b"plain")
            plain.connect(t.endpoint)
            plain.send(encode(Heartbeat(worker_id="plain")))
            bad = [
                ZmqWorkerChannel(t.endpoint, "unknown-key", curve=unknown),
                ZmqWorkerChannel(t.endpoint, "wrong-server", curve=stranger),
            ]
            try:
                for ch in bad:
                    ch.send(Heartbeat(worker_id=ch.worker_id))
                with ZmqWorkerChannel(
                    t.endpoint, "good", curve=load_worker_keys(root, "good")
                ) as ch:
                    ch.send(Hello(protocol_version=PROTOCOL_VERSION, worker_id="good", pid=1))
                    await asyncio.wait_for(got.wait(), WAIT_S)
                    welcome = Welcome(protocol_version=PROTOCOL_VERSION, store_dir="/gps")
                    t.send("good", welcome)
                    assert await asyncio.to_thread(ch.recv, WAIT_S) == welcome
                    # Give the refused peers time for several handshake retries.
                    for _ in range(100):
                        if t.refused_peers >= 1:
                            break
                        await asyncio.sleep(0.05)
                    await asyncio.sleep(0.5)
                assert [w for w, _ in inbox] == ["good"]
                assert t.refused_peers >= 1 and t.bad_frames == 0
            finally:
                for ch in bad:
                    ch.close()
                plain.close(linger=0)
                ctx.term()

    with caplog.at_level(logging.WARNING, logger="pivotflow.transport.curve"):
        asyncio.run(main())
    assert any(unknown.public_key.decode() in r.getMessage() for r in caplog.records)


def test_a_client_added_later_is_admitted_after_reload(tmp_path: Path) -> None:
    root = keygen(tmp_path, clients=["w0"])

    async def main() -> None:
        inbox: list[str] = []
        got = asyncio.Event()

        def handler(worker_id: str, msg: ToController) -> None:
            inbox.append(worker_id)
            got.set()

        with ZmqControllerTransport(
            f"ipc://{tmp_path}/c.sock", curve=load_controller_keys(root)
        ) as t:
            t.start(handler)
            assert t.authenticator is not None
            late = add_client(root, "late")
            with ZmqWorkerChannel(t.endpoint, "late", curve=late) as ch:
                ch.send(Heartbeat(worker_id="late"))
                for _ in range(200):  # refused until the controller re-reads its allow list
                    if t.refused_peers:
                        break
                    await asyncio.sleep(0.02)
                assert t.refused_peers >= 1 and not inbox
            t.authenticator.reload()
            # A refused session is over for good (zmq does not retry an auth failure), so the
            # worker connects again.
            with ZmqWorkerChannel(t.endpoint, "late", curve=late) as ch:
                ch.send(Heartbeat(worker_id="late"))
                await asyncio.wait_for(got.wait(), WAIT_S)
        assert inbox == ["late"] and t.refused_peers == 1

    asyncio.run(main())
