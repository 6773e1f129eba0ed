"""Small simulated workloads the tests under tests/sim share. (Their own module, not conftest:
a ``from conftest import`` finds whichever conftest was imported first, and tests/engines has
one too.)"""

from __future__ import annotations

import tomllib
from pathlib import Path

from pivotflow.sim.workload import Workload, parse_workload

BASE = Path(__file__).parents[2] / "bench/workloads/dense7b_judge7b.toml"


def tiny(hardware: dict[str, object] | None = None, **workload: object) -> Workload:
    """The 7B+7B workload shrunk to 8 GPUs and short responses, so a run takes well under 1s.
    ``hardware`` overrides ``[hardware]`` figures (``FAST_SHIFTS``: shifts that pay on steps
    of a few seconds; the file's take ~2.6 s, as long as a step)."""
    data = tomllib.loads(BASE.read_text())
    data["workload"].update(gpus=8, prompts_per_step=8, group_size=4, steps=4)
    data["workload"].update(workload)
    data["hardware"].update(hardware or {})
    data["response"].update(median_tokens=200, cap_tokens=1000)
    data["judge"].update(template_tokens=50, verdict_tokens=16)
    return parse_workload(data, "tiny.toml")


# A tiny drifting workload file (the 7B+7B group at 8 GPUs, responses 100 -> 400 tokens over
# steps 2-4) for the benches that take a file; ``--at 0`` holds its early regime.
TINY_DRIFT_TOML = f"""extends = "{BASE}"
[workload]
name = "tiny-drift"
gpus = 8
prompts_per_step = 8
group_size = 4
steps = 8
[response]
median_tokens = 100
cap_tokens = 1000
[judge]
template_tokens = 50
verdict_tokens = 16
[hardware]
engine_start_s = 0.05
load_gb_s = 2000.0
release_s = 0.01
[schedule]
source = "a test"
response_median_tokens = [[0, 100], [2, 100], [4, 400]]
response_cap_tokens = [[0, 1000], [2, 1000], [4, 3000]]
"""


FAST_SHIFTS = {"engine_start_s": 0.05, "load_gb_s": 2000.0, "release_s": 0.01}
