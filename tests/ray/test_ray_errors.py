"""``launcher=ray`` set up wrong fails at once with one line naming what (no cluster needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pivotflow.errors import ConfigError
from pivotflow.run import run

pytestmark = pytest.mark.timeout(120)

GRAPH = Path(__file__).resolve().parents[2] / "graphs" / "grpo_rule.py"


def test_ray_not_installed_is_a_clear_error(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if absent: `import ray` fails
    with pytest.raises(ConfigError, match=r"launcher=ray: ray is not installed \(pip install "
                                          r"'pivotflow\[ray\]'\)") as err:
        run(GRAPH, sets=["live=false", "launcher=ray"], out=tmp_path / "out", steps=1,
            console=False)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()  # refused before anything was made


def test_an_unreachable_address_is_a_clear_error(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("this process is connected to a cluster already")
    with pytest.raises(ConfigError, match=r"ray.address=127.0.0.1:1: cannot reach a Ray "
                                          r"cluster there \(Connection refused\)") as err:
        run(GRAPH, sets=["live=false", "launcher=ray", "ray.address=127.0.0.1:1"],
            out=tmp_path / "out", steps=1, console=False)
    assert "\n" not in str(err.value)
    # refused before ray.init, whose retries take minutes: it never connected
    assert not ray.is_initialized()


@pytest.mark.parametrize(("key", "value", "message"), [
    ("launcher", "k8s", "--set launcher=k8s: unknown launcher; valid: local, ray"),
    ("ray.strategy", "ROUND_ROBIN", "--set ray.strategy=ROUND_ROBIN: unknown placement"),
    ("ray.cpus_per_worker", "-1", "--set ray.cpus_per_worker=-1.0: must be >= 0"),
    ("ray.adress", "auto", "--set ray.adress=auto: unknown key; valid keys: "),
])
def test_bad_ray_settings_are_one_line_errors(key: str, value: str, message: str) -> None:
    from pivotflow.config import parse_overrides, resolve

    with pytest.raises(ConfigError) as err:
        resolve(parse_overrides([f"{key}={value}"]), {})
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
