"""ShmParamStore with real, independent processes (subprocess, never fork) on /dev/shm."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import torch

from pivotflow.errors import CheckpointError, ConfigError, ModelConfigError
from pivotflow.params.base import ParamStore
from pivotflow.params.held import BUFFER, INDEX
from pivotflow.params.index import FORMAT, TensorEntry, decode, encode
from pivotflow.params.shm_store import ShmParamStore, default_root

# The model's Hugging Face config as data, with what real ones hold: nested objects, lists, null.
CFG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 97,
    "rope_scaling": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "eos_token_id": [1, 2],
    "tie_word_embeddings": True,
}

# A process that holds model@version until its stdin closes (or it is killed).
HOLDER = """
import sys
from pivotflow.params.shm_store import ShmParamStore
held = ShmParamStore(sys.argv[1]).acquire(sys.argv[2], int(sys.argv[3]))
print("held", held.version, flush=True)
sys.stdin.read()
"""

# Prints, per tensor, its dtype, shape and raw bytes as hex (what another process sees).
DUMP = """
import json, sys
from pivotflow.params.shm_store import ShmParamStore
v, _, ts = ShmParamStore(sys.argv[1]).load(sys.argv[2], verify=True)
print(json.dumps({"version": v, "tensors": {k: [str(t.dtype), list(t.shape),
      t.reshape(-1).view(__import__("torch").uint8).numpy().tobytes().hex()]
      for k, t in ts.items()}}))
"""

# Loads the latest version again and again until told to stop, checking values and crc32 while
# holding it (acquire) and after copying it out (load_into).
READER = """
import json, os, pathlib, sys, time, torch
from pivotflow.errors import CheckpointError
from pivotflow.params.shm_store import ShmParamStore
root = pathlib.Path(sys.argv[1])
store, loads, seen, bad = ShmParamStore(root), 0, set(), []
dest = {"w": torch.empty(256, 257), "b": torch.empty(1000, dtype=torch.int64)}
(root / f"ready-{os.getpid()}").touch()
while not (root / "stop").exists():
    if not (root / "policy" / "LATEST").exists():
        time.sleep(0.005)
        continue
    try:
        held = store.acquire("policy")
    except CheckpointError as exc:  # collected between LATEST and our lock, 8 times running
        assert "is not there" in str(exc), exc
        continue
    with held:
        v = held.version
        # Hold across two more publishes: were the lock ignored, gc would free this version and
        # the next publish would reuse its buffer under our views.
        time.sleep(0.01)
        held.verify()
        if not (held.tensors["w"] == v).all() or not (held.tensors["b"] == v).all():
            bad.append(["held", v, held.tensors["w"].unique().tolist()[:4]])
    v2 = store.load_into("policy", dest)
    if not (dest["w"] == v2).all() or not (dest["b"] == v2).all():
        bad.append(["load_into", v2, dest["w"].unique().tolist()[:4]])
    loads += 2
    seen.add(v)
print(json.dumps({"loads": loads, "seen": len(seen), "bad": bad}), flush=True)
os._exit(0)  # skip torch's slow interpreter teardown; nothing is left to flush
"""


def _run(script: str, *args: object, stdin: int | None = None) -> subprocess.Popen[str]:
    # One OpenMP thread each: several interpreters share a small host in these tests.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        text=True,
        stdin=stdin,
        stdout=subprocess.PIPE,
        env=env,
    )


@pytest.fixture
def store() -> Iterator[ShmParamStore]:
    s = ShmParamStore(default_root(f"test-{os.getpid()}-{time.monotonic_ns()}"), checksum=True)
    yield s
    s.cleanup()


def _bytes(t: torch.Tensor) -> bytes:
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def _params(v: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(v)
    f = torch.randn(33, 17, generator=g)
    f[0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, 1e-45])  # bits, not values
    return {
        "f32": f,
        "bf16": torch.randn(8, 9, generator=g).bfloat16(),
        "i64": torch.tensor([2**62 + v, -(2**63), 0, 7]),
        "scalar": torch.tensor(v + 0.5),
        "empty": torch.empty(0, 5),
        "strided": torch.arange(24.0).view(4, 6).t(),
    }


def test_round_trip_is_bit_exact_in_another_process(store: ShmParamStore) -> None:
    params = _params(3)
    store.publish("policy", 0, params, CFG)
    out = json.loads(_run(DUMP, store.root, "policy").communicate(timeout=60)[0])
    assert out["version"] == 0
    for name, t in params.items():
        assert out["tensors"][name] == [str(t.dtype), list(t.shape), _bytes(t).hex()], name
    v, cfg, views = store.load("policy", copy=True)
    assert (v, cfg) == (0, CFG) and all(_bytes(views[k]) == _bytes(t) for k, t in params.items())
    dest = {k: torch.zeros_like(t) for k, t in params.items()}
    dest["strided"] = torch.zeros(4, 6).t()  # not contiguous: goes through the mapped view
    assert store.load_into("policy", dest) == 0
    assert all(_bytes(dest[k].contiguous()) == _bytes(t) for k, t in params.items())


def test_latest_moves_forward_only(store: ShmParamStore) -> None:
    generic: ParamStore = store  # what a run holds; mypy checks the backend conforms
    with pytest.raises(CheckpointError, match="no version of 'policy'"):
        generic.latest("policy")
    for v in (0, 1, 5):
        generic.publish("policy", v, _params(v), CFG)
        assert generic.latest("policy") == v
    generic.publish("policy", 2, _params(2), CFG)  # late, lower: stored, not latest
    assert generic.latest("policy") == 5 and store.versions("policy") == [0, 1, 2, 5]
    assert _bytes(generic.load("policy", 2)[2]["f32"]) == _bytes(_params(2)["f32"])


def test_held_versions_survive_gc_until_the_holder_exits_or_is_killed(
    store: ShmParamStore,
) -> None:
    for v in range(1, 6):
        store.publish("policy", v, _params(v), CFG)
    # Two independent processes: one will exit normally, the other be SIGKILLed.
    polite, killed = (_run(HOLDER, store.root, "policy", v, stdin=subprocess.PIPE) for v in (1, 3))
    for proc, v in ((polite, "1"), (killed, "3")):
        assert proc.stdout is not None and proc.stdout.readline().split() == ["held", v]
    assert store.gc("policy", keep=1) == [2, 4]
    assert store.versions("policy") == [1, 3, 5]
    assert _bytes(store.load("policy", 1)[2]["f32"]) == _bytes(_params(1)["f32"])
    polite.communicate("", timeout=30)  # closes stdin: the holder returns normally
    assert store.gc("policy", keep=1) == [1]
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    assert store.gc("policy", keep=1) == [3] and store.versions("policy") == [5]
    with pytest.raises(CheckpointError, match=r"policy@v1 is not there"):
        store.load("policy", 1)


def test_concurrent_publisher_and_readers_never_see_a_torn_version(
    store: ShmParamStore,
) -> None:
    readers = [_run(READER, store.root) for _ in range(3)]
    deadline = time.monotonic() + 60
    while len(list(store.root.glob("ready-*"))) < len(readers) and time.monotonic() < deadline:
        time.sleep(0.01)
    # This process publishes (and collects, as a trainer does) while the readers load.
    end, v = time.monotonic() + 1.0, 0
    while time.monotonic() < end:
        v += 1
        store.publish(
            "policy",
            v,
            {"w": torch.full((256, 257), float(v)), "b": torch.full((1000,), v, dtype=torch.int64)},
            CFG,
        )
        store.gc("policy", keep=1)
    (store.root / "stop").touch()
    results = [json.loads(r.communicate(timeout=60)[0]) for r in readers]
    assert v >= 5
    for r in results:
        assert r["bad"] == [] and r["loads"] >= 10 and r["seen"] >= 2, r
    store.gc("policy", keep=1)  # the readers are gone: what they held goes too
    assert store.versions("policy") == [v]


def test_views_hold_the_version_and_writes_stay_private(store: ShmParamStore) -> None:
    store.publish("policy", 1, _params(1), CFG)
    store.publish("policy", 2, _params(2), CFG)
    _, _, views = store.load("policy", 1)
    w = views.pop("f32")
    views.clear()
    assert store.gc("policy", keep=1) == []  # one live view is enough
    w.add_(1.0)  # copy-on-write: this process's page only
    assert _bytes(store.load("policy", 1, copy=True)[2]["f32"]) == _bytes(_params(1)["f32"])
    del w
    assert store.gc("policy", keep=1) == [1]


def test_republish_keeps_holders_on_the_old_bytes(store: ShmParamStore) -> None:
    store.publish("policy", 1, _params(1), CFG)
    with store.acquire("policy", 1) as old:
        store.publish("policy", 1, _params(9), CFG)
        assert _bytes(old.tensors["f32"]) == _bytes(_params(1)["f32"])
        assert _bytes(store.load("policy", 1)[2]["f32"]) == _bytes(_params(9)["f32"])
        store.gc("policy")
        assert any(n.startswith(".trash-") for n in os.listdir(store.root / "policy"))
    store.gc("policy")
    assert not any(n.startswith(".trash-") for n in os.listdir(store.root / "policy"))


def test_corrupt_index_or_buffer_raises_naming_the_file(store: ShmParamStore) -> None:
    store.publish("policy", 1, _params(1), CFG)
    vdir = store.root / "policy" / "v0000000001"
    good = (vdir / INDEX).read_bytes()
    (vdir / INDEX).write_bytes(b"\x93not an index")
    with pytest.raises(CheckpointError, match=str(vdir / INDEX)):
        store.load("policy")
    index = decode(good, vdir / INDEX)
    bad = [TensorEntry("w", "float32", (4,), index.nbytes, 16)]  # past the buffer's end
    (vdir / INDEX).write_bytes(encode(msgspec.structs.replace(index, entries=bad)))
    with pytest.raises(CheckpointError, match=f"{vdir / INDEX}.*outside"):
        store.load("policy")
    (vdir / INDEX).write_bytes(good)
    with open(vdir / BUFFER, "r+b") as f:
        f.seek(index.entries[0].offset)
        f.write(b"\xff\xff")
    with pytest.raises(CheckpointError, match=f"{vdir / BUFFER}: crc32"):
        store.load("policy", verify=True)
    os.truncate(vdir / BUFFER, 100)
    with pytest.raises(CheckpointError, match=f"{vdir / BUFFER} has 100 bytes"):
        store.load("policy")


def test_load_into_rejects_mismatches_and_leaves_dest_untouched(store: ShmParamStore) -> None:
    store.publish("policy", 1, {"a": torch.ones(2, 3), "b": torch.ones(4)}, CFG)
    b = torch.zeros(4)
    cases = {
        "'a' is torch.float32 \\[2, 3\\] in the store, torch.float32 \\[3, 2\\]": torch.zeros(3, 2),
        "'a' is torch.float32 \\[2, 3\\] in the store, torch.bfloat16": torch.zeros(
            2, 3
        ).bfloat16(),
    }
    for message, a in cases.items():
        with pytest.raises(ModelConfigError, match=message):
            store.load_into("policy", {"b": b, "a": a})
    assert not b.any()
    with pytest.raises(ModelConfigError, match="'c' is not in the store"):
        store.load_into("policy", {"c": b})
    with pytest.raises(ModelConfigError, match=r"lacks \['a'\]"):
        store.load_into("policy", {"b": b})
    assert store.load_into("policy", {"b": b}, strict=False) == 1 and b.eq(1).all()
    a16 = torch.zeros(2, 3, dtype=torch.bfloat16)
    store.load_into("policy", {"a": a16, "b": b}, cast=True)
    assert a16.eq(1).all()


def test_bad_names_and_knobs_are_config_errors(store: ShmParamStore) -> None:
    for name in ("", "../x", ".hidden", "a/b"):
        with pytest.raises(ConfigError, match="bad model name"):
            store.publish(name, 0, {}, CFG)
    with pytest.raises(ConfigError, match="keep must be >= 1"):
        store.gc("policy", keep=0)
    with pytest.raises(CheckpointError, match="'x' is not a str -> torch.Tensor"):
        store.publish("policy", 0, {"x": [1.0]}, CFG)  # type: ignore[dict-item]


def test_gc_sweeps_a_dead_publishers_leftovers_only(store: ShmParamStore) -> None:
    store.publish("policy.optim", 0, {"exp_avg": torch.zeros(3)}, CFG)
    dead = subprocess.Popen(["true"])
    dead.wait()
    mdir = store.root / "policy.optim"
    (mdir / f".tmp-v1-{dead.pid}-abc").mkdir()
    (mdir / f".tmp-v1-{os.getpid()}-def").mkdir()  # alive: a publish in progress here
    store.gc("policy.optim")
    assert sorted(n for n in os.listdir(mdir) if n.startswith(".tmp-")) == [
        f".tmp-v1-{os.getpid()}-def"
    ]


def test_cleanup_removes_everything_under_the_root(store: ShmParamStore) -> None:
    for v in range(4):
        store.publish("policy", v, _params(v), CFG)
        store.publish("policy.optim", v, {"m": torch.zeros(10)}, CFG)
    store.gc("policy", keep=1)
    assert Path(store.root, "policy", ".spare").is_dir()
    store.cleanup()
    assert not store.root.exists()


def test_the_config_is_the_published_dict_and_each_load_gets_its_own(
    store: ShmParamStore,
) -> None:
    store.publish("policy", 1, _params(1), CFG)
    _, first, _ = store.load("policy")
    assert first == CFG
    first["vocab_size"] = 5  # a reader changing its copy changes nobody else's
    with store.acquire("policy") as held:
        assert held.config == CFG


def test_a_config_that_is_not_data_is_refused(store: ShmParamStore) -> None:
    class ModelConfig:  # what format 1 stored: an engine's own description of the model
        vocab_size = 97

    with pytest.raises(CheckpointError, match="must be the model's Hugging Face config as a "
                       r"dict \(config.json's contents\), got ModelConfig"):
        store.publish("policy", 0, _params(0), ModelConfig())  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="publish policy@v0: the config is not JSON data"):
        store.publish("policy", 0, _params(0), {"vocab_size": object()})
    assert store.versions("policy") == []


def test_an_index_of_another_format_is_a_one_line_error(store: ShmParamStore) -> None:
    store.publish("policy", 1, _params(1), CFG)
    path = store.root / "policy" / "v0000000001" / INDEX
    index = decode(path.read_bytes(), path)
    path.write_bytes(encode(msgspec.structs.replace(index, format=FORMAT - 1)))
    with pytest.raises(CheckpointError) as err:
        store.load("policy")
    assert str(err.value) == (f"parameter index {path} has format {FORMAT - 1}; this pivotflow "
                              f"reads format {FORMAT} (publish the model again)")
