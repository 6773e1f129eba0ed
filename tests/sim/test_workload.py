from __future__ import annotations

import copy
import glob
import tomllib
from pathlib import Path

import pytest

from pivotflow.errors import ConfigError
from pivotflow.sim.workload import load_workload, parse_workload

WORKLOADS = sorted(
    p
    for p in glob.glob(str(Path(__file__).parents[2] / "bench/workloads/*.toml"))
    if not Path(p).name.startswith("cpu_")  # calibration workloads, not the paper's groups
)
CPU = Path(__file__).parents[2] / "bench/workloads/cpu_tiny_longtail.toml"
BASE = Path(__file__).parents[2] / "bench/workloads/dense7b_judge7b.toml"


def test_four_shipped_workloads_load() -> None:
    assert len(WORKLOADS) == 4
    loaded = [load_workload(p) for p in WORKLOADS]
    assert any(w.policy.moe for w in loaded) and any(not w.policy.moe for w in loaded)
    for w in loaded:
        assert 500 <= w.response.median <= 2000
        assert 8192 <= w.response.cap <= 20480
        assert w.gpus == 128


def _data() -> dict:
    return tomllib.loads(BASE.read_text())


def _bad(mutate: object) -> str:
    data = copy.deepcopy(_data())
    mutate(data)  # type: ignore[operator]
    with pytest.raises(ConfigError) as info:
        parse_workload(data, "w.toml")
    return str(info.value)


def test_missing_key_names_file_table_and_key() -> None:
    msg = _bad(lambda d: d["policy"].pop("layers"))
    assert "w.toml" in msg and "[policy] layers" in msg and "required" in msg


def test_wrong_type_and_range_are_named() -> None:
    assert "[workload] gpus" in _bad(lambda d: d["workload"].update(gpus="many"))
    assert "[hardware] mem_util" in _bad(lambda d: d["hardware"].update(mem_util=1.5))
    assert "[response] cap_tokens" in _bad(lambda d: d["response"].update(cap_tokens=10))


def test_unknown_keys_and_tables_are_errors() -> None:
    assert "tflop" in _bad(lambda d: d["hardware"].update(tflop=1))
    assert "extra" in _bad(lambda d: d.update(extra={}))
    assert "decode_fast" in _bad(lambda d: d["policy"].update(measured={"decode_fast": 1.0}))


def test_a_model_that_does_not_fit_its_gpus_is_rejected() -> None:
    assert "do not fit" in _bad(lambda d: d["policy"].update(params_b=70.0))


def test_measured_coefficients_are_kept() -> None:
    data = _data()
    data["policy"]["measured"] = {"decode_base_s": 0.01, "train_per_token_s": 1e-4}
    w = parse_workload(data, "w.toml")
    assert w.policy.measured == {"decode_base_s": 0.01, "train_per_token_s": 1e-4}


def test_unreadable_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.toml"):
        load_workload(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[workload\n")
    with pytest.raises(ConfigError, match="bad.toml cannot be parsed"):
        load_workload(bad)


def test_scaling_keeps_work_per_gpu() -> None:
    w = load_workload(BASE)
    big = w.scaled(1024)
    assert big.gpus == 1024 and big.prompts_per_step == w.prompts_per_step * 8
    assert w.scaled(2).gpus == 2  # one worker generating, one training: planners that move
    with pytest.raises(ConfigError, match="--gpus 1 .* room for 2 workers"):
        w.scaled(1)
    with pytest.raises(ConfigError, match="--gpus 129 must be a multiple"):
        load_workload(BASE.with_name("dense32b_judge32b.toml")).scaled(129)



def test_the_cpu_calibration_workload_uses_measured_costs() -> None:
    from pivotflow.sim.cost_model import CostModel
    from pivotflow.sim.fluid import fluid_bound

    w = load_workload(CPU)
    cost = CostModel(w)
    assert cost.decode(w.policy, 8).base == w.policy.measured["decode_base_s"]
    assert cost.load_s("train", w.policy) == w.policy.measured["load_s"]
    assert cost.mean_prompt() == 6.0  # p99_over_median = 1: a fixed length
    assert 0 < fluid_bound(w)["samples_per_s"] < 1000


def test_calibration_keys_are_validated() -> None:
    data = _data()
    data["policy"]["measured"] = {"train_per_token_s_world2": 2e-4, "train_regroup_s_world2": 0.1,
                                  "train_no_signal_per_token_s_world3": 7e-5}
    assert parse_workload(data, "w.toml").policy.measured["train_per_token_s_world2"] == 2e-4
    err = _bad(lambda d: d["policy"].update(measured={"train_per_token_s_world1": 1.0}))
    assert "train_per_token_s_world1" in err and "N >= 2" in err
    err = _bad(lambda d: d["response"].update(draw="dice"))
    assert "[response] draw = 'dice'" in err and "budget" in err
    assert "[hardware] cores" in _bad(lambda d: d["hardware"].update(cores=-1))
    w = load_workload(CPU)
    assert w.response.draw == "budget" and w.hardware.cores == 2
