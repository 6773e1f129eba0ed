"""The local launcher gives each worker GPUs of its own (``CUDA_VISIBLE_DEVICES``), so eight
workers on an 8-GPU node use eight GPUs rather than all opening GPU 0: slots of
``gpus_per_worker`` GPUs (or 1/n of one), a dead worker's slot to its replacement, too few
slots a one-line error before anything starts. Real worker processes; this host has no GPU, so
they run on CPU and what is checked is what each was given."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from pivotflow.errors import ConfigError
from pivotflow.launch.local import LocalLauncher, gpu_slots
from pivotflow.run import run

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent
GRPO = ROOT / "graphs" / "grpo_genrm.py"


def test_gpus_are_cut_into_slots() -> None:
    gpus = [str(i) for i in range(5)]
    assert gpu_slots(gpus, 2) == [["0", "1"], ["2", "3"]]  # GPU 4 left idle
    assert gpu_slots(gpus[:2], 0.5) == [["0"], ["0"], ["1"], ["1"]]
    assert gpu_slots(gpus, 1) == [[g] for g in gpus]
    with pytest.raises(ConfigError, match=r"^--set gpus_per_worker=1\.5: give a whole number"):
        gpu_slots(gpus, 1.5)
    with pytest.raises(ConfigError, match=r"^--set gpus_per_worker=0\.3: a fraction of a GPU "
                                          r"must be 1/n"):
        gpu_slots(gpus, 0.3)


def visible_devices(pid: int) -> str:
    """The process's CUDA_VISIBLE_DEVICES. Read again until it shows: Popen returns once the
    child's exec has closed its close-on-exec pipe, which the kernel does before it lays out
    the new environment, so a read in that moment finds none (it failed so once, under a
    loaded CI run)."""
    deadline = time.monotonic() + 10.0
    while True:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        found = [e.split(b"=", 1)[1].decode() for e in env
                 if e.startswith(b"CUDA_VISIBLE_DEVICES=")]
        if found or time.monotonic() > deadline:
            assert found, f"process {pid} has no CUDA_VISIBLE_DEVICES ({len(env)} entries)"
            return found[0]
        time.sleep(0.02)


def test_each_worker_gets_its_own_gpus_and_a_replacement_the_dead_ones(tmp_path: Path) -> None:
    nobody = f"ipc://{tmp_path}/nobody-listens"  # the workers wait for a controller
    launcher = LocalLauncher(nobody, tmp_path / "logs", gpu_slots=gpu_slots(
        [str(i) for i in range(6)], 2))
    try:
        for w in ("w0", "w1", "w2"):
            launcher.start(w)
        given = {w: visible_devices(p.pid) for w, p in launcher.procs.items()}
        assert given == {"w0": "0,1", "w1": "2,3", "w2": "4,5"} == launcher.gpus_given
        with pytest.raises(RuntimeError, match="every one of the 3 GPU slots holds a running"):
            launcher.start("w3")
        assert launcher.kill("w1")
        launcher.start("w1~r1")  # the replacement waits for the killed one to let go
        assert launcher.procs["w1"].poll() is not None
        assert visible_devices(launcher.procs["w1~r1"].pid) == "2,3"
    finally:
        launcher.stop(timeout_s=0.1)


def test_too_few_gpu_slots_are_named_before_anything_starts(tmp_path: Path) -> None:
    # (a whole run handing out GPUs, replacements included: tests/test_zero_run.py)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"^3 workers need 3 GPU slots of 2 GPUs; GPUs "
                                          r"3,5,7 give 1 \(--set gpus="):
        run(GRPO, sets=["live=false", "gpus=3,5,7", "gpus_per_worker=2"],
            out=tmp_path / "run2", steps=2, console=False)
    assert time.monotonic() - t0 < 30  # refused before any worker started


@pytest.mark.skipif("CUDA_VISIBLE_DEVICES" in os.environ or torch.cuda.device_count() > 0,
                    reason="this host shows GPUs")
def test_cuda_on_a_host_without_a_gpu_is_named_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--set device=cuda: this host shows no GPU"):
        run(GRPO, sets=["live=false", "device=cuda"], out=tmp_path / "run", steps=1,
            console=False)
