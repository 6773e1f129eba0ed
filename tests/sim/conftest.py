from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import tomllib

from pivotflow.sim.workload import Workload, parse_workload

BASE = Path(__file__).parents[2] / "bench/workloads/dense7b_judge7b.toml"


def tiny(**workload: object) -> Workload:
    """The 7B+7B workload shrunk to 8 GPUs and short responses, so a run takes well under 1s."""
    data = tomllib.loads(BASE.read_text())
    data["workload"].update(gpus=8, prompts_per_step=8, group_size=4, steps=4)
    data["workload"].update(workload)
    data["response"].update(median_tokens=200, cap_tokens=1000)
    data["judge"].update(template_tokens=50, verdict_tokens=16)
    return parse_workload(data, "tiny.toml")


@pytest.fixture
def tiny_workload() -> Workload:
    return tiny()


def load_bench_script(name: str) -> ModuleType:
    """``bench/<name>.py`` as a module (bench/ holds scripts, not a package)."""
    path = Path(__file__).parents[2] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bench_script() -> Callable[[str], ModuleType]:
    return load_bench_script
